"""Activation patching: which heads and which residual positions carry a prediction.

Run a clean and a corrupted prompt (same length), then rerun the corrupted one with a piece
of the clean run's activations put back (`edits.patch`) and see how much of the clean
behaviour returns. The metric defaults to the logit difference between an answer and a wrong
token at the last position (mean over the batch); the effect of a patch is normalized,

    effect = (metric(patched) - metric(corrupted)) / (metric(clean) - metric(corrupted))

so 1 means the patch restores the clean run's metric and 0 means it changes nothing
(TransformerLens's `patching.py` and the IOI papers use the same normalization).
`activation_patching` patches each head's output ("context", TransformerLens's hook_z) at
every position and the residual stream entering each layer ("resid_pre") at each position;
with `blocks=True` also each layer's attention and MLP outputs ("attn_out", "mlp_out") at
each position (TransformerLens's get_act_patch_block_every); with `qkv=True` also each head's
queries, keys, values and attention weights at every position, which tells through which
input a head's effect runs (get_act_patch_attn_head_all_pos_every). `attribution_patching`
estimates the head and residual effects at once from one corrupted run and its backward
pass (first order: the effect of moving each value from its corrupted to its clean state
along the metric's gradient). The runs they share are `runs.py`'s (`PatchRuns`), the edits
`edits.py`'s, the drawing `viz/heads.py`'s; path patching is `paths.py`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ..model.gpt import check_position, per_row_ids
from ..model.names import HEAD_INPUTS, NAMES, SUMMARIES, WEIGHT_NAMES, absent_names
from ..model.runtime import wide
from ..model.trace import Trace
from .edits import Edit, Edits
from .runs import Metric, PatchRuns, Progress, Site

#: `activation_patching` starts each pass at the lowest layer it patches, from the corrupted
#: run's residual stream there; False runs every pass from the embeddings (a baseline)
RESTARTS = True


def logit_diff_metric(answer: int | Tensor, wrong: int | Tensor, position: int = -1) -> Metric:
    """logits -> mean over rows of logit[answer] - logit[wrong] at `position` (default last),
    in float32 or the logits' own wider dtype. answer/wrong: one id for every row, or (B,)
    ids."""
    return LogitDiff(answer, wrong, position)


class LogitDiff:
    """`logit_diff_metric`'s metric. Reading the last position alone (position -1), it says so
    (`last_logits_only`), and patching then has the model compute no other position's
    logits: the unembedding of every other position is work no effect needs."""

    def __init__(self, answer: int | Tensor, wrong: int | Tensor, position: int) -> None:
        self.answer, self.wrong, self.position = answer, wrong, position
        self.last_logits_only = position == -1
        self._ids: dict[tuple[int, int, torch.device], tuple[Tensor, Tensor]] = {}

    def __call__(self, logits: Tensor) -> Tensor:
        return self.per_copy(logits, 1)[0]

    def per_copy(self, logits: Tensor, n: int) -> Tensor:
        """(n,): the metric of each of n copies of a batch of B rows stacked on dimension 0,
        logits (n B, T, V), as n calls would give it, from one gather (and no read-back of the
        ids after the first call: on a GPU each read waits for the queued work)."""
        check_position(self.position, logits.shape[1], "metric position")
        # a tiny random float64 GPT-2's patching effects on a 1e-3 gap were off by 1e-5 when
        # its logits were cast to float32
        last = logits[:, self.position].to(wide(logits.dtype))  # (n B, V)
        a, w = self._checked_ids(last.shape[0] // n, last.shape[-1], last.device)  # (B, 1)
        diff = last.gather(-1, a.repeat(n, 1)) - last.gather(-1, w.repeat(n, 1))  # (n B, 1)
        return diff.view(n, -1).mean(dim=1)  # (n,)

    def _checked_ids(self, B: int, V: int, device: torch.device) -> tuple[Tensor, Tensor]:
        """The answer and wrong ids as (B, 1) on `device`, checked against V ids once."""
        key = (B, V, device)
        if key not in self._ids:
            a = per_row_ids(self.answer, B, "answer", device)[:, None]  # (B, 1)
            w = per_row_ids(self.wrong, B, "wrong", device)[:, None]  # (B, 1)
            for flag, ids in (("answer", a), ("wrong", w)):
                if int(ids.min()) < 0 or int(ids.max()) >= V:
                    raise ValueError(f"{flag} ids {ids[:, 0].tolist()} outside the model's "
                                     f"{V} token ids; pass ids the tokenizer gives")
            self._ids[key] = (a, w)
        return self._ids[key]


@dataclass
class Patching:
    """Normalized effects of patching clean activations into the corrupted run."""

    heads: Tensor  # (n_layer, nh): each head's output, every position
    resid: Tensor  # (n_layer, T): the residual stream entering each layer, one position
    clean: float  # metric of the clean run
    corrupted: float  # metric of the corrupted run
    #: (n_layer, nh, T): each head's output at one position (`by_position=True`), else None
    heads_by_position: Tensor | None = None
    #: (n_layer, T) each: each layer's attention output and MLP output at one position
    #: (`blocks=True`), else None
    attn_out: Tensor | None = None
    mlp_out: Tensor | None = None
    #: each head's queries (n_layer, nh), each key-value head's keys and values (n_layer,
    #: nkv: grouped-query heads share theirs) and each head's attention weights (n_layer,
    #: nh), every position (`qkv=True`), else None
    q: Tensor | None = None
    k: Tensor | None = None
    v: Tensor | None = None
    attn_weights: Tensor | None = None

    def to_dict(self) -> dict[str, Any]:
        extra = {name: getattr(self, name).tolist() for name in OPTIONAL_GRIDS
                 if getattr(self, name) is not None}
        return {"heads": self.heads.tolist(), "resid": self.resid.tolist(), **extra,
                "clean_metric": self.clean, "corrupted_metric": self.corrupted}


#: `Patching`'s grids that only some experiments fill, in its order
OPTIONAL_GRIDS = ("heads_by_position", "attn_out", "mlp_out", "q", "k", "v", "attn_weights")


@torch.no_grad()
def patch_effect(model: Any, clean_ids: Tensor, corrupt_ids: Tensor, metric: Metric,
                 make_edits: Callable[[Trace], Edits],
                 attention_mask: Tensor | None = None, *,
                 names: Iterable[str] | None = None) -> float:
    """The normalized effect of one patch: `make_edits(clean_trace)` builds the edits
    (e.g. `lambda t: Edits([patch(t, "resid_pre", 1, positions=[3])])`). names: what the
    clean trace keeps; default every name but the (B, nh, T, S) scores and weights and their
    summaries (name those to patch them)."""
    kept = tuple(n for n in NAMES if n not in WEIGHT_NAMES | SUMMARIES) if names is None \
        else tuple(names)
    runner = PatchRuns(model, clean_ids, corrupt_ids, metric, attention_mask, names=kept)
    return runner.effect(make_edits(runner.trace))


@torch.no_grad()
def activation_patching(
    model: Any,
    clean_ids: Tensor,
    corrupt_ids: Tensor,
    metric: Metric,
    attention_mask: Tensor | None = None,
    *,
    batch: int | None = None,
    progress: Progress | None = None,
    by_position: bool = False,
    blocks: bool = False,
    qkv: bool = False,
) -> Patching:
    """Patch every head's output and every (layer, position) of the residual stream from the
    clean run into the corrupted one; ids (B, T), one attention_mask for both. by_position:
    also every head's output at each position alone (`heads_by_position`, TransformerLens's
    get_act_patch_attn_head_out_by_pos: n_layer x nh x T more runs). blocks: also each
    layer's attention output and MLP output at each position (`attn_out`, `mlp_out`:
    2 x n_layer x T more runs; a model without either is refused). qkv: also each head's
    queries and attention weights and each key-value head's keys and values, every position
    (`q`, `k`, `v`, `attn_weights`: n_layer x 2 (nh + nkv) more runs; the weights' patches
    take attention's explicit path). Each patch is
    a corrupted run of its own, `batch` of them per forward pass (None: `PatchRuns.per_pass`'s
    choice, up to 32 as long as their logits fit 256 MiB; 1: one pass each); `progress(done,
    total)` hears as each pass goes, block by block (`runs.PassProgress`). A metric with
    `last_logits_only` True (`logit_diff_metric` at the last position) is handed the last
    position's logits alone, (B, 1, V)."""
    c, T = model.config, clean_ids.shape[1]
    outputs = _outputs(c) if blocks else ()
    inputs = tuple(HEAD_INPUTS) if qkv else ()
    runner = PatchRuns(model, clean_ids, corrupt_ids, metric, attention_mask, RESTARTS,
                     ("context", "resid_pre", *outputs, *inputs))
    batch = runner.per_pass(batch)
    grids = _grids(c, T, by_position, outputs, inputs)  # {field: (its sites, its shape)}
    sites = [site for group, _ in grids.values() for site in group]
    # in layer order, each pass restarts where its first patch is, from the corrupted run's
    # residual stream there: the blocks before it would compute what they did in that run
    order = sorted(range(len(sites)), key=lambda i: sites[i][1])
    effects = torch.empty(len(sites), dtype=wide(model.lm_head.weight.dtype))
    effects[order] = torch.tensor(runner.effects([sites[i] for i in order], batch, progress),
                                  dtype=effects.dtype)
    found: dict[str, Tensor] = {}
    for field, (group, shape) in grids.items():  # effects are in the grids' order
        # (len(group),) -> the grid's shape, e.g. (n_layer, nh) or (n_layer, T)
        found[field], effects = effects[:len(group)].view(shape), effects[len(group):]
    return Patching(clean=runner.clean, corrupted=runner.corrupted, **found)


def _outputs(c: Any) -> tuple[str, ...]:
    """What blocks=True patches: each layer's attention and MLP outputs, if the model has
    both (else a ValueError saying which it lacks)."""
    absent = absent_names(c)
    for name in ("attn_out", "mlp_out"):
        if name in absent:
            raise ValueError(f"blocks=True patches {name}, and this model never computes it, "
                             f"as {absent[name]}; patch heads and the residual stream "
                             "(blocks=False)")
    return ("attn_out", "mlp_out")


def _grids(c: Any, T: int, by_position: bool, outputs: tuple[str, ...],
           inputs: tuple[str, ...]) -> dict[str, tuple[list[Site], tuple[int, ...]]]:
    """`activation_patching`'s experiments: each `Patching` field it fills, with the sites it
    patches (layer by layer, then cell by cell, as the grid is laid out) and the grid's
    shape."""
    L, H = c.n_layer, c.n_head

    def every_layer(name: str, cells: Sequence[tuple[int, ...]], *dims: int
                    ) -> tuple[list[Site], tuple[int, ...]]:
        return [(name, layer, cell) for layer in range(L) for cell in cells], (L, *dims)

    heads = [(h,) for h in range(H)]
    positions = [(p,) for p in range(T)]
    grids = {"heads": every_layer("context", heads, H),
             "resid": every_layer("resid_pre", positions, T)}
    if by_position:
        grids["heads_by_position"] = every_layer(
            "context", [(h, p) for h in range(H) for p in range(T)], H, T)
    grids |= {name: every_layer(name, positions, T) for name in outputs}
    kv_heads = [(h,) for h in range(c.n_kv_heads)]  # keys and values: one per group
    grids |= {name: every_layer(name, kv_heads, len(kv_heads)) if name in ("k", "v")
              else every_layer(name, heads, H) for name in inputs}
    return grids


def attribution_patching(
    model: Any,
    clean_ids: Tensor,
    corrupt_ids: Tensor,
    metric: Metric,
    attention_mask: Tensor | None = None,
    *,
    by_position: bool = False,
    blocks: bool = False,
    qkv: bool = False,
) -> Patching:
    """`activation_patching`'s effects to first order, from a clean run, a corrupted run and
    one backward pass (attribution patching): each value's (clean - corrupted) difference
    times the metric's gradient at the corrupted run, summed over the patched cells and
    normalized as there. Exact for a metric linear in the value; a large effect through
    softmax or a norm may be over- or underestimated, so confirm the heads it ranks first
    with `activation_patching` or `patch_effect`. The model's parameters get no gradient.
    by_position, blocks, qkv: the grids `activation_patching` fills with them, from the same
    pass (each head's output at each position; each layer's attention and MLP outputs at
    each position; each head's inputs)."""
    if torch.is_inference_mode_enabled():  # enable_grad cannot undo it: nothing records
        raise ValueError("attribution_patching needs autograd, which torch.inference_mode() "
                         "turns off; call it outside inference mode (it uses its own no_grad "
                         "where it can)")
    outputs = _outputs(model.config) if blocks else ()
    with torch.no_grad():
        names = ("context", "resid_pre", *outputs, *(HEAD_INPUTS if qkv else ()))
        runner = PatchRuns(model, clean_ids, corrupt_ids, metric, attention_mask, names=names)
    n_layer, dtype = model.config.n_layer, wide(model.lm_head.weight.dtype)
    sites = [(layer, name) for layer in range(n_layer) for name in names]
    held: dict[tuple[int, str], Tensor] = {}

    def hold(layer: int, name: str) -> Edit:
        def replace(value: Tensor, first: int) -> Tensor:
            held[(layer, name)] = value
            return value  # unchanged: the gradient flows on through it
        return Edit(name, layer, replace)

    # embeddings as a leaf: every value downstream has a gradient, frozen parameters or not
    start = Edit("emb", None, lambda value, first: value.detach().requires_grad_())
    with torch.enable_grad():
        logits = runner.forward(runner.corrupt_ids, runner.mask,
                                edits=Edits([start, *(hold(*site) for site in sites)]))
        score = runner.scored(logits)
        if not score.requires_grad:
            raise ValueError(
                "the metric's value has no gradient with respect to the logits (argmax, a "
                "comparison, .item() or no_grad inside it), so there is nothing to attribute; "
                "use a differentiable metric such as logit_diff_metric, or activation_patching")
        grads = dict(zip(sites, torch.autograd.grad(score,
                                                     [held[site] for site in sites]),
                         strict=True))
    gap = runner.clean - runner.corrupted

    def attribution(layer: int, name: str) -> Tensor:
        moved = runner.trace.get(name, layer) - held[(layer, name)].detach()  # clean - corrupted
        return (moved * grads[(layer, name)]).to(dtype) / gap  # same shape as the value

    def grid(name: str, summed: tuple[int, ...]) -> Tensor:
        """(n_layer, ...): each layer's attribution summed over the dimensions `summed`."""
        return torch.stack([attribution(layer, name).sum(dim=summed)
                            for layer in range(n_layer)]).cpu()

    per_head = (0, 2, 3)  # (B, nh, T, hs) -> (nh,)
    found = {"heads": grid("context", per_head), "resid": grid("resid_pre", (0, 2))}  # (T,)
    if by_position:
        found["heads_by_position"] = grid("context", (0, 3))  # (n_layer, nh, T)
    found |= {name: grid(name, (0, 2)) for name in outputs}  # (B, T, C) -> (T,)
    found |= {name: grid(name, per_head) for name in names if name in HEAD_INPUTS}
    return Patching(clean=runner.clean, corrupted=runner.corrupted, **found)
