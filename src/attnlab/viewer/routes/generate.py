"""POST /api/generate: new tokens as server-sent events, sampled from the served model.

`GenerateRequestBase` holds the body's fields; the bounds of `max_new_tokens` and `top_k`
are the app's (`ServeConfig.max_new_tokens`, the model's vocab_size), so `router` subclasses
it per app as `GenerateRequest` (the name /openapi.json shows), and the schema and the 422
messages name the app's own bounds. The events are `payloads.stream_events`'; the sampling
is `generate/sampling.py`'s.

No `from __future__ import annotations` here: the endpoint's body is that per-app class, a
local name FastAPI can only read from an annotation evaluated when the endpoint is defined.
"""

from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from ..payloads import stream_events, token_stream
from ..state import RequestError, ViewerState

NEW_TOKENS = "tokens to generate; stops early when the context is full"
TOP_K = "sample among the k most likely tokens"
# the 200 answer in the schema: an event stream, not JSON
EVENTS: dict[int | str, dict[str, Any]] = {
    200: {"content": {"text/event-stream": {}},
          "description": "events `start` {prompt_ids}, `token` {id, text} per token, then "
                         "`done` or `error`"},
}


class GenerateRequestBase(BaseModel):
    """The body of /api/generate without the app's bounds (`router` adds them)."""

    model_config = ConfigDict(extra="forbid")
    text: str = Field(description="the prompt (at least one token)")
    max_new_tokens: int = Field(64, ge=1, description=NEW_TOKENS)
    temperature: float = Field(
        1.0, ge=0.0, le=5.0, allow_inf_nan=False, description="0: most likely token"
    )
    top_k: int | None = Field(None, ge=1, description=TOP_K)
    top_p: float | None = Field(
        None, gt=0.0, le=1.0, allow_inf_nan=False, description="nucleus: smallest set of mass p"
    )
    min_p: float | None = Field(
        None, ge=0.0, le=1.0, allow_inf_nan=False,
        description="drop tokens less likely than min_p times the most likely one",
    )
    typical_p: float | None = Field(
        None, gt=0.0, le=1.0, allow_inf_nan=False,
        description="keep the tokens whose surprisal is nearest the entropy, holding this "
        "mass (after min_p); 1: all",
    )
    repetition_penalty: float = Field(
        1.0, gt=0.0, allow_inf_nan=False,
        description="divide the logits of tokens already in the text by this (multiply "
        "negative ones), greedy too; 1: off",
    )
    no_repeat_ngram_size: int = Field(
        0, ge=0, description="never make an n-gram of this many tokens the text already "
        "holds, greedy too; 0: off",
    )
    # at most 2**53 - 1: the largest integer JavaScript (the page, /docs) holds exactly
    seed: int | None = Field(None, ge=0, le=2**53 - 1, description="same seed, same tokens")


def event_stream(
    state: ViewerState, body: GenerateRequestBase, request: Request
) -> StreamingResponse:
    """The generation `body` asks for, as a stream of server-sent events."""
    ids = state.encode(body.text)
    c = state.model.config
    # a generation stops when the context is full: positions past block_size have no
    # embedding. The last new token is never fed back, so block_size - P + 1 fit (as in
    # `attnlab generate`); the page shows the attention of the first block_size tokens
    new_tokens = min(body.max_new_tokens, c.block_size - len(ids) + 1)
    reason = "max_new_tokens" if new_tokens == body.max_new_tokens else "block_size"
    tokens = token_stream(
        state.model, ids, max_new_tokens=new_tokens, temperature=body.temperature,
        top_k=body.top_k, top_p=body.top_p, min_p=body.min_p, typical_p=body.typical_p,
        repetition_penalty=body.repetition_penalty,
        no_repeat_ngram_size=body.no_repeat_ngram_size, seed=body.seed, eot_ids=state.stop_ids,
        vocab_size=state.tokenizer.vocab_size,  # a larger model vocabulary has ids it cannot decode
        unused_ids=sorted(getattr(state.tokenizer, "unused_ids", ())),
    )

    async def step() -> int | None:
        try:
            # `left`: a step stops between blocks when the client leaves (a long prompt's
            # prefill is one step); an ASGI 2.4 server cancels no stream when its client goes
            token: int | None = await state.locked(lambda: next(tokens, None),
                                                   left=request.is_disconnected)
        except RequestError as err:  # out of memory, stopping: the `error` event says so
            raise ValueError(str(err)) from None
        return token

    async def events() -> AsyncIterator[bytes]:
        try:
            async for event in stream_events(
                step, state.tokenizer, ids, state.stop_ids, reason, request.is_disconnected,
            ):
                yield event
        finally:
            close = getattr(tokens, "close", None)
            if close is not None:
                close()

    return StreamingResponse(
        events(), media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


def router(state: ViewerState) -> APIRouter:
    """/api/generate for the model `state` serves, its body bounded by the app's limits."""

    # no docstring: it would become the schema's description
    class GenerateRequest(GenerateRequestBase):
        max_new_tokens: int = Field(
            64, ge=1, le=state.limits.max_new_tokens, description=NEW_TOKENS)
        top_k: int | None = Field(
            None, ge=1, le=state.model.config.vocab_size, description=TOP_K)

    routes = APIRouter()

    @routes.post("/api/generate", response_class=StreamingResponse, responses=EVENTS)
    async def generate(body: GenerateRequest, request: Request) -> StreamingResponse:
        """Stream new tokens as server-sent events: `start`, `token` per token, then `done`."""
        return event_stream(state, body, request)

    return routes
