"""POST /api/routing: a mixture of experts' routing of one text, the page's routing panel
(`web/routing_panel.js`, drawn by `web/routing.js` as show()'s routing tab is).

The answer is `payloads.routing_answer` (a trace's "expert_weights"); texts and ids are
checked as for /api/attention (`state.ViewerState.request_ids`). A dense model (n_experts
unset) routes nothing: the page shows no panel for one, and this route refuses it by name.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field, StrictInt

from ..payloads import routing_answer
from ..state import RequestError, ViewerState


class RoutingRequest(BaseModel):
    """Exactly one of `text` or `ids`."""

    model_config = ConfigDict(extra="forbid")
    text: str | None = Field(None, description="text to route")
    ids: list[StrictInt] | None = Field(None, description="token ids to route instead")
    layers: list[StrictInt] | None = Field(None, description="layers to return (default: all)")


def checked_routing(state: ViewerState, body: RoutingRequest) -> list[int]:
    """The token ids `body` asks about, after every check that can refuse it (a dense
    model, text or ids, layers, the size of the answer)."""
    c = state.model.config
    if c.n_experts is None:
        raise RequestError("this model routes no token: its MLP is one dense MLP a block "
                           "(n_experts unset); /api/routing answers for a mixture of experts, "
                           "a model with n_experts set")
    ids = state.request_ids(body.text, body.ids)
    n_layers = state.layer_count(body.layers)
    dense = [i for i in body.layers or [] if not c.has_mixture(i)]
    if dense and c.mixture_layers is None:
        raise RequestError(f"layers {dense} have one dense MLP (the first dense_layers="
                           f"{c.dense_layers} blocks) and route nothing; ask for layers from "
                           f"{c.dense_layers} on")
    if dense:
        raise RequestError(f"layers {dense} have one dense MLP and route nothing; ask for "
                           f"layers among the mixtures' {c.mixture_layers}")
    n_weights = n_layers * len(ids) * c.n_experts
    if n_weights > state.limits.max_weights:
        raise RequestError(
            f"{n_layers} layers x {len(ids)} tokens x {c.n_experts} experts are {n_weights} "
            f"weights, over the limit of {state.limits.max_weights}; ask for fewer layers, "
            'e.g. "layers": [0]')
    return ids


def router(state: ViewerState) -> APIRouter:
    """/api/routing for the model `state` serves."""
    routes = APIRouter()

    @routes.post("/api/routing")
    async def routing(body: RoutingRequest, request: Request) -> dict[str, Any]:
        """Per layer, each token's weight on each expert (0: not chosen) and each expert's
        share of the tokens, for a mixture of experts (n_experts set)."""
        ids = checked_routing(state, body)
        return await state.locked(
            lambda: routing_answer(state.model, ids, state.tokenizer, body.layers),
            left=request.is_disconnected)

    return routes
