"""The viewer's intervention API: head detector scores with a next-token prediction under
ablation (`POST /api/heads`), and the logit lens (`POST /api/lens`).

`server.create_app` owns the app, its limits, its error format and the model lock, and
calls `add_routes`; this module only adds two routes over `heads.py`, `intervene.py` and
`lens.py`. The page's panel for them is `web/heads.js`.
"""


from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ..interp.edits import ablate, check_heads
from ..interp.heads import detect_heads, rank_heads
from ..interp.lens import lens_table, top_tokens
from ..tokenizers import token_text


def heads_payload(model: Any, tokenizer: Any, ids: list[int], ablated: list[tuple[int, int]],
                  k: int = 5) -> dict[str, Any]:
    """Detector scores on `ids` and the next-token top-k intact and with `ablated` heads."""
    idx = torch.tensor([ids], device=model.wte.weight.device)
    with torch.no_grad():
        scores = detect_heads(model, idx)
        intact = model(idx, last_logits_only=True).logits[0, -1]  # (V,)
        edited = model(idx, edits=ablate(ablated), last_logits_only=True).logits[0, -1]

    def top(logits: Tensor) -> list[dict[str, Any]]:
        probs, top_ids = top_tokens(logits[: tokenizer.vocab_size], k)
        return [{"id": int(i), "text": token_text(tokenizer, int(i)), "prob": round(float(p), 4)}
                for p, i in zip(probs, top_ids, strict=True)]

    return {
        "scores": {kind: [[round(float(x), 4) for x in row] for row in s.tolist()]
                   for kind, s in scores.items()},
        "induction_ranking": [[la, h] for la, h in rank_heads(scores["induction"])],
        "ablated": [[la, h] for la, h in ablated],
        "prediction": {"intact": top(intact), "ablated": top(edited)},
    }


def lens_payload(model: Any, tokenizer: Any, ids: list[int], k: int = 3) -> dict[str, Any]:
    """Top-k next tokens read after the embeddings and after each layer, at every position."""
    table = lens_table(model, tokenizer, ids, k)
    return {
        "ids": ids,  # the tokens read: the page shows the lens only while it shows these
        "layers": table.layers,
        "top": [[[{"text": text, "prob": round(float(p), 4)}
                  for p, text in zip(ps, texts, strict=True)]
                 for ps, texts in zip(p_row, t_row, strict=True)]
                for p_row, t_row in zip(table.probs.tolist(), table.texts, strict=True)],
    }


def add_routes(app: Any, model: Any, tokenizer: Any, locked: Callable[..., Any],
               max_text_chars: int) -> None:
    """Add /api/heads and /api/lens to `app`; `locked` runs a function under the model
    lock. Texts are checked and tokenized as /api/attention does."""
    from pydantic import BaseModel, ConfigDict, Field

    from .app import RequestError, _check_length, _encode

    c = model.config

    def encode(text: str) -> list[int]:
        ids = _encode(tokenizer, text, max_text_chars)
        _check_length(ids, c.block_size)
        return ids

    class HeadsRequest(BaseModel):
        model_config = ConfigDict(extra="forbid")
        text: str = Field(description="text to score the heads on (at least 2 tokens)")
        ablate: list[tuple[int, int]] = Field(
            default_factory=list, description="[layer, head] pairs to zero for the prediction")

    class LensRequest(BaseModel):
        model_config = ConfigDict(extra="forbid")
        text: str = Field(description="text to read the residual stream of")

    @app.post("/api/heads")
    async def heads(body: HeadsRequest) -> dict[str, Any]:
        """Detector scores per layer and head on the text, and the next-token prediction
        with and without the `ablate` heads (zeroed)."""
        ids = encode(body.text)
        if len(ids) < 2:
            raise RequestError("head detectors need a text of at least 2 tokens")
        try:
            check_heads(body.ablate, c.n_layer, c.n_head)
        except ValueError as err:
            raise RequestError(str(err)) from None
        return await locked(lambda: heads_payload(model, tokenizer, ids, body.ablate))

    @app.post("/api/lens")
    async def lens(body: LensRequest) -> dict[str, Any]:
        """The logit lens: top-3 next tokens after the embeddings and each layer, per
        position."""
        ids = encode(body.text)
        return await locked(lambda: lens_payload(model, tokenizer, ids))
