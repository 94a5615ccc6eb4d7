"""GET /api/model and POST /api/attention: what the model is, and one text's attention
weights per layer and head (the lower triangle: the causal mask makes the rest exactly 0).

The request and response models are the schema /openapi.json shows; the payload itself is
`payloads.attention_payload`'s, the checks of text and ids `state.ViewerState`'s.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt
from starlette.concurrency import run_in_threadpool

from ..payloads import attention_json, attention_payload
from ..state import RequestError, ViewerState


class AttentionRequest(BaseModel):
    """Exactly one of `text` (tokenized here) or `ids` (e.g. a generation's tokens)."""

    model_config = ConfigDict(extra="forbid")
    text: str | None = Field(None, description="text to tokenize and run")
    # strict: true or 1.0 read as an index would hide a typo, as for `norms`
    ids: list[StrictInt] | None = Field(None, description="token ids to run instead of text")
    layers: list[StrictInt] | None = Field(None, description="layers to return (default: all)")
    norms: StrictBool = Field(  # "yes" or 1 read as true would hide a typo
        False, description="also return per-token L2 norms of q, k, v")
    encoding: Literal["lists", "float32"] = Field(
        "lists", description="lists: each head's rows as numbers rounded to the server's "
        "decimals (5 unless `attnlab serve --decimals`; GET /api/model's limits say); "
        "float32: each head as one base64 string of little-endian float32, the rows of "
        "the lower triangle one after another (exact, and faster for long texts)")


class LayerAttention(BaseModel):
    layer: int
    heads: list[list[list[float]]] | list[str] = Field(
        description="(nh, T, i + 1): row i holds the weights of query i on keys 0..i; the "
        "causal mask makes every weight on a later key exactly 0, so those are left out "
        "(encoding float32: one base64 string per head)"
    )
    future_max: float = Field(description="largest weight on a later key (0.0: causal)")
    window: int | None = Field(
        description="sliding window: query i sees keys i - window < j <= i; the weights "
        "on earlier keys are masked, exactly 0 (null: no window in this layer)"
    )
    norms: dict[str, list[list[float]]] | None = Field(
        None, description="q (nh, T), k and v (nkv, T): L2 norm of each token's vector"
    )


class AttentionResponse(BaseModel):
    tokens: list[dict[str, Any]] = Field(description="[{id, text}] one per token")
    n_head: int
    layers: list[LayerAttention]


def checked_request(state: ViewerState, body: AttentionRequest) -> list[int]:
    """The token ids `body` asks about, after every check that can refuse it (text or ids,
    layers, the size of the answer)."""
    c = state.model.config
    ids = state.request_ids(body.text, body.ids)
    n_layers = state.layer_count(body.layers)
    n_weights = n_layers * c.n_head * len(ids) * (len(ids) + 1) // 2
    max_weights = state.limits.max_weights
    if n_weights > max_weights:
        raise RequestError(
            f"{n_layers} layers x {c.n_head} heads at {len(ids)} tokens are {n_weights} "
            f"weights, over the limit of {max_weights}; ask for fewer layers, "
            'e.g. "layers": [0]'
        )
    return ids


def router(state: ViewerState) -> APIRouter:
    """/api/model and /api/attention for the model `state` serves."""
    routes = APIRouter()

    @routes.get("/api/model")
    async def model_info() -> dict[str, Any]:
        """Model config, parameter count, tokenizer, training summary and request limits."""
        return state.summary

    @routes.post("/api/attention", response_model=AttentionResponse)
    async def attention(body: AttentionRequest, request: Request) -> Response:
        """Tokens and per-layer, per-head attention weights (lower triangle) of one text."""
        ids = checked_request(state, body)
        payload = await state.locked(
            lambda: attention_payload(
                state.model, ids, state.tokenizer, layers=body.layers, norms=body.norms,
                decimals=state.limits.decimals, encoding=body.encoding,
            ),
            left=request.is_disconnected,
        )
        # json.dumps directly: FastAPI's encoder walks every float, far slower on an answer
        # of this size (docs/performance.md#viewer-json); in the threadpool, outside the model
        # lock, a head at a time: seconds for 8M rounded weights, while the loop serves others
        return Response(await run_in_threadpool(attention_json, payload),
                        media_type="application/json")

    return routes
