"""POST /api/heads and /api/lens: head detector scores with the next-token prediction under
ablation, and the logit lens. The page's panel for them is `web/heads.js`.

The answers are `payloads.heads_payload` and `payloads.lens_payload` (over `interp/`);
texts are checked and tokenized as for /api/attention (`state.ViewerState.encode`).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field, StrictInt

from ...interp.edits import check_heads
from ..payloads import heads_payload, lens_payload
from ..state import RequestError, ViewerState


class HeadsRequest(BaseModel):
    """Exactly one of `text` or `ids` (at least 2 tokens)."""

    model_config = ConfigDict(extra="forbid")
    text: str | None = Field(None, description="text to score the heads on")
    ids: list[StrictInt] | None = Field(None, description="token ids to score them on instead")
    ablate: list[tuple[StrictInt, StrictInt]] = Field(
        default_factory=list, description="[layer, head] pairs to zero for the prediction")


class LensRequest(BaseModel):
    """Exactly one of `text` or `ids`."""

    model_config = ConfigDict(extra="forbid")
    text: str | None = Field(None, description="text to read the residual stream of")
    ids: list[StrictInt] | None = Field(None, description="token ids to read instead")


def router(state: ViewerState) -> APIRouter:
    """/api/heads and /api/lens for the model `state` serves."""
    c = state.model.config
    routes = APIRouter()

    @routes.post("/api/heads")
    async def heads(body: HeadsRequest, request: Request) -> dict[str, Any]:
        """Detector scores per layer and head on the text, the heads overview (per-head
        summary means, `summary_*`, as show(..., summary=True) draws them too), and the
        next-token prediction with and without the `ablate` heads (zeroed)."""
        ids = state.request_ids(body.text, body.ids)
        if len(ids) < 2:
            tokens = f"{len(ids)} token{'' if len(ids) == 1 else 's'}"
            raise RequestError(f"the text is {tokens}; head detectors need at least 2 tokens "
                               "(a query and a key before it): give a longer text")
        try:
            check_heads(body.ablate, c.n_layer, c.n_head)
        except ValueError as err:
            raise RequestError(str(err)) from None
        return await state.locked(
            lambda: heads_payload(state.model, state.tokenizer, ids, body.ablate),
            left=request.is_disconnected)

    @routes.post("/api/lens")
    async def lens(body: LensRequest, request: Request) -> dict[str, Any]:
        """The logit lens: top-3 next tokens after the embeddings and each layer, per
        position."""
        ids = state.request_ids(body.text, body.ids)
        return await state.locked(lambda: lens_payload(state.model, state.tokenizer, ids),
                                  left=request.is_disconnected)

    return routes
