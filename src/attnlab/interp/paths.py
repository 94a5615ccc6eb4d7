"""Path patching: what a head sends along chosen paths alone.

Activation patching asks what a head's output does through everything after it; path
patching (Wang et al. 2022, "Interpretability in the Wild", section 3.1) asks what it does
through one route: into chosen receiver heads' queries, keys or values, or straight to the
logits. In attnlab's direction (the clean run's values into the corrupted run, as
`activation_patching`), for each sender head:

1. the corrupted run, with the sender's output from the clean run and every other head's
   output frozen at its corrupted value, MLPs and norms recomputed: the sender's change
   moves on through the residual stream and the MLPs alone. The receivers' inputs are
   recorded;
2. the corrupted run again, with only the receivers' inputs taken from step 1; its metric,
   normalized as `activation_patching`'s, is the sender's effect along those paths.

Without receivers, step 1's own logits are scored: each head's effect through the residual
stream and the MLPs after it, no other head. The noising direction (the paper's: the clean
run, the sender's output corrupted) is the same function with the prompts swapped; its
effects are the share of the corruption's change that each path carries. The runs are
`runs.py`'s, the edits `edits.py`'s.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ..model.runtime import wide
from ..model.trace import Trace
from .edits import Edit, Edits, check_heads
from .runs import Metric, PassProgress, PatchRuns, Progress

#: the receiver inputs a path can end in
INPUTS = ("q", "k", "v")


@dataclass
class PathPatching:
    """Normalized effects of each sender head along the paths to the receivers."""

    #: (n_layer, nh): each head's effect; NaN for heads at or after the last receiver's
    #: layer, which no path from them reaches
    senders: Tensor
    receivers: list[tuple[int, int]] | None  # (layer, head) pairs; None: the logits
    via: tuple[str, ...]  # the receivers' inputs patched: of "q", "k", "v" (() for logits)
    clean: float  # metric of the clean run
    corrupted: float  # metric of the corrupted run

    def to_dict(self) -> dict[str, Any]:
        return {"senders": [[None if math.isnan(e) else e for e in row]
                            for row in self.senders.tolist()],
                "receivers": self.receivers, "via": list(self.via),
                "clean_metric": self.clean, "corrupted_metric": self.corrupted}


@torch.no_grad()
def path_patching(
    model: Any,
    clean_ids: Tensor,
    corrupt_ids: Tensor,
    metric: Metric,
    receivers: tuple[int, int] | Iterable[tuple[int, int]] | None = None,
    attention_mask: Tensor | None = None,
    *,
    via: str | Iterable[str] | None = None,
    batch: int | None = None,
    progress: Progress | None = None,
) -> PathPatching:
    """Each head's effect along its paths to `receivers` (a (layer, head) pair, or several)
    through their inputs `via` ("q", "k", "v", or several; None: all three), or with
    receivers None to the logits through the residual stream and MLPs alone; ids (B, T),
    one attention_mask for both. Keys and
    values of a grouped-query model belong to key-value heads: a receiver's are its group's,
    and patching them reaches every query head of the group. Every head before the last
    receiver's layer is a sender (all heads, for the logits), two corrupted runs each,
    `batch` senders per forward pass (None: as `activation_patching` chooses; 1: one each);
    `progress(done, total)` hears as each pass goes, block by block (`runs.PassProgress`)."""
    c = model.config
    chosen = None if receivers is None else check_receivers(receivers, c)
    if chosen is None and via is not None:
        raise ValueError(f"via={via!r} names receivers' inputs, and receivers=None asks for "
                         "the paths to the logits; name receivers, or leave out via")
    inputs = () if chosen is None else check_via(INPUTS if via is None else via)
    runs = PatchRuns(model, clean_ids, corrupt_ids, metric, attention_mask, restarts=True,
                     names=("context",), corrupt_names=("context",))
    batch = runs.per_pass(batch)
    end = c.n_layer if chosen is None else max(layer for layer, _ in chosen)
    senders = [(layer, h) for layer in range(end) for h in range(c.n_head)]
    effects = torch.full((c.n_layer, c.n_head), math.nan,
                         dtype=wide(model.lm_head.weight.dtype))  # (n_layer, nh)
    groups = [senders[start:start + batch] for start in range(0, len(senders), batch)]
    # step 1 from its first sender or receiver, step 2 from its first receiver
    step2 = 0 if chosen is None else runs.blocks_from(min(layer for layer, _ in chosen))
    firsts = [min(layer for layer, _ in group + (chosen or [])) for group in groups]
    passes = [(len(group), runs.blocks_from(first) + step2)
              for group, first in zip(groups, firsts, strict=True)]
    heard = PassProgress(model, progress, passes)
    for group, (n, blocks) in zip(groups, passes, strict=True):
        received = None if chosen is None else Trace(
            names=inputs, layers=sorted({layer for layer, _ in chosen}))
        with heard.runs(n, blocks):
            logits = _senders_run(runs, group, chosen, received)  # (n B, T or 1, V)
            if chosen is not None and received is not None:
                logits = _receivers_run(runs, len(group), chosen, inputs, received)
            for (layer, h), value in zip(group, runs.scored_copies(logits, len(group)),
                                         strict=True):
                effects[layer, h] = runs.normalized(value)
    return PathPatching(effects, chosen, inputs, runs.clean, runs.corrupted)


def _senders_run(runs: PatchRuns, group: list[tuple[int, int]],
                 receivers: list[tuple[int, int]] | None, received: Trace | None) -> Tensor:
    """Step 1 for n senders at once, copy i of the corrupted batch sending group[i]: every
    head's output is the corrupted run's, but the sender's, the clean run's. The logits
    (n B, T or 1, V); `received` records the receivers' inputs."""
    n, B = len(group), runs.corrupt_ids.shape[0]
    # before the first sender every copy is the corrupted run; it starts there, or at an
    # earlier receiver, whose inputs are then recorded too
    first = min(layer for layer, _ in group + (receivers or []))

    def frozen(layer: int) -> Edit:
        corrupted = runs.corrupted_value("context", layer)  # (B, nh, T, hs)
        clean = runs.trace.get("context", layer)  # (B, nh, T, hs)

        def replace(value: Tensor, first_column: int) -> Tensor:
            out = corrupted.repeat(n, 1, 1, 1).to(value)  # (n B, nh, T, hs)
            for i, (sender_layer, h) in enumerate(group):
                if sender_layer == layer:
                    out[i * B:(i + 1) * B, h] = clean[:, h].to(value)  # (B, T, hs)
            return out

        return Edit("context", layer, replace)

    edits = Edits([frozen(layer) for layer in range(first, runs.model.config.n_layer)])
    return runs.copies(n, first, edits, received)


def _receivers_run(runs: PatchRuns, n: int, receivers: list[tuple[int, int]],
                   inputs: tuple[str, ...], received: Trace) -> Tensor:
    """Step 2: n copies of the corrupted run, each receiver's inputs from step 1's copy of
    it. The logits (n B, T or 1, V)."""
    c = runs.model.config
    group = c.n_head // c.n_kv_heads  # query heads per key-value head
    edits = []
    for name in inputs:
        for layer in sorted({layer for layer, _ in receivers}):
            heads = tuple(sorted({h if name == "q" else h // group
                                  for la, h in receivers if la == layer}))
            edits.append(Edit(name, layer, _taking(received.get(name, layer)), heads))
    return runs.copies(n, min(layer for layer, _ in receivers), Edits(edits))


def _taking(source: Tensor) -> Callable[[Tensor, int], Tensor]:
    """An edit's replacement: `source` (n B, heads, T, hs), recorded by step 1."""
    return lambda value, first: source.to(value)


def check_receivers(receivers: tuple[int, int] | Iterable[tuple[int, int]], config: Any
                    ) -> list[tuple[int, int]]:
    """The (layer, head) pairs (one pair alone, or several), sorted and checked: some, all in
    the model, and after layer 0; else a ValueError that says which. `path_patching` and
    `attnlab patch --paths-to` both check with it."""
    pairs: list[Any] = list(receivers)
    if len(pairs) == 2 and all(_integer(x) for x in pairs):  # one pair: (2, 1)
        pairs = [pairs]
    try:  # operator.index: integers (numpy's too), never a float truncated
        chosen = sorted({(operator.index(layer), operator.index(h)) for layer, h in pairs})
    except (TypeError, ValueError):
        raise ValueError(f"receivers={receivers!r}: give (layer, head) pairs, e.g. "
                         "[(2, 1), (3, 0)], or one pair") from None
    if not chosen:
        raise ValueError("receivers=[] names no head; give (layer, head) pairs, or None for "
                         "the paths to the logits")
    check_heads(chosen, config.n_layer, config.n_head)
    if max(layer for layer, _ in chosen) == 0:
        raise ValueError(f"receivers {chosen} are all in layer 0, which no head comes before; "
                         "choose receivers in a later layer")
    return chosen


def _integer(x: Any) -> bool:
    """True for an integer index (int, numpy's integers, a 0-d integer tensor), not a bool."""
    try:
        operator.index(x)
    except TypeError:
        return False
    return not isinstance(x, bool)


def check_via(via: str | Iterable[str]) -> tuple[str, ...]:
    """`via` as a tuple in INPUTS order, checked (a ValueError names what is unknown), for
    `path_patching` and `attnlab patch --via`."""
    names = {via} if isinstance(via, str) else set(via)
    unknown = sorted(names - set(INPUTS))
    if unknown or not names:
        raise ValueError(f"via={sorted(names)}: a path ends in the receivers' queries, keys "
                         f"or values; choose from {list(INPUTS)}")
    return tuple(name for name in INPUTS if name in names)
