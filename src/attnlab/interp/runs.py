"""The runs every patching experiment shares: a clean and a corrupted run of the same ids, the
metric's normalization between them, and corrupted runs with patches, several to a forward
pass. `patching.py` (activation and attribution patching) and `paths.py` (path patching)
build their experiments on `PatchRuns`; the edits are `edits.py`'s.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor

from ..model.gpt import require_eval
from ..model.trace import Trace
from .edits import Edit, Edits

#: logits (B, T, V) -> the one number to explain: a scalar tensor, reduced over the batch
#: (`.mean()`); activation patching also takes a Python float, attribution needs the graph.
Metric = Callable[[Tensor], Tensor]
#: (runs done, runs in all): called as each pass of patched runs goes (`PassProgress`). One
#: with a `work(done, total)` method hears the passes' work there too, before each count.
Progress = Callable[[int, int], None]
#: What one corrupted run patches: a name, a layer and the cell of its value from dimension
#: 1 on: ("context", layer, (head,)), ("context", layer, (head, position)), or one position
#: of a (B, T, C) value: ("resid_pre", layer, (position,)), "attn_out" or "mlp_out" alike.
Site = tuple[str, int, tuple[int, ...]]
#: an experiment runs this many patches per forward pass at most, each on its own
#: copy of the corrupted batch: fewer, larger matrix products (on a GPU, far fewer launches)
BATCH = 32
#: ... and no more than fit their logits in this many bytes
LOGIT_BYTES = 1 << 28


class PatchRuns:
    """The clean trace and the normalization, shared by every patch of one experiment."""

    def __init__(self, model: Any, clean_ids: Tensor, corrupt_ids: Tensor, metric: Metric,
                 attention_mask: Tensor | None, restarts: bool = False,
                 names: tuple[str, ...] = ("context", "resid_pre"),
                 corrupt_names: tuple[str, ...] = ()) -> None:
        """names: what the clean run's trace (`self.trace`) keeps; corrupt_names: what the
        corrupted run's (`self.corrupt_trace`) keeps, besides the residual stream entering
        each block where runs restart."""
        require_eval(model, "every patching effect")
        if clean_ids.shape != corrupt_ids.shape:
            raise ValueError(
                f"clean ids {tuple(clean_ids.shape)} and corrupted ids "
                f"{tuple(corrupt_ids.shape)} must have the same shape: patching swaps "
                "activations position by position (pick prompts of equal token length)"
            )
        device = model.lm_head.weight.device  # the caller's ids may be on the host
        clean_ids, corrupt_ids = clean_ids.to(device), corrupt_ids.to(device)
        attention_mask = None if attention_mask is None else attention_mask.to(device)
        self.model, self.corrupt_ids, self.metric = model, corrupt_ids, metric
        self.mask = attention_mask
        # a metric that reads only the last position's logits: the model computes no others
        self.last = getattr(metric, "last_logits_only", False) is True
        # the metric sees NaN logits at padded positions: reading one is an error, not a
        # number (a right-padded batch's last column is a pad in its shorter rows)
        self.pads = None if attention_mask is None or bool(attention_mask.all()) else (
            attention_mask[:, -clean_ids.shape[1]:, None] == 0)  # (B, T, 1)
        self.trace = Trace(names=names)  # what the patches take from the clean run
        self.clean = self.score(self.forward(clean_ids, attention_mask, trace=self.trace))
        # restarts: the corrupted run's residual stream entering each block, where a patched
        # run starts (the blocks before its first patch compute what they computed here)
        kept = [*(["resid_pre"] if restarts else []), *corrupt_names]
        self.corrupt_trace = Trace(names=kept) if kept else None
        self.restarts = self.corrupt_trace if restarts else None
        self.corrupted = self.score(self.forward(corrupt_ids, attention_mask,
                                                 trace=self.corrupt_trace))
        if abs(self.clean - self.corrupted) < 1e-6:
            raise ValueError(
                f"the clean and corrupted runs score the same ({self.clean:.6g}), so no "
                "effect can be normalized; pick a corruption that changes the metric"
            )

    def corrupted_value(self, name: str, layer: int) -> Tensor:
        """The corrupted run's `name` at `layer`, as `corrupt_names` (or restarts, for
        resid_pre) asked it to be kept."""
        if self.corrupt_trace is None:
            raise ValueError(f"the corrupted run kept nothing, so not {name!r}; build PatchRuns "
                             f"with corrupt_names=({name!r},)")
        return self.corrupt_trace.get(name, layer)

    def per_pass(self, batch: int | None) -> int:
        """How many patched runs share a forward pass: `batch`, checked, or for None as
        many as `BATCH` and `LOGIT_BYTES` allow."""
        if batch is None:
            B, T = self.corrupt_ids.shape
            columns = 1 if self.last else T  # of logits per row
            head = self.model.lm_head.weight  # (V, C)
            per_patch = B * columns * head.shape[0] * head.element_size()
            return max(1, min(BATCH, LOGIT_BYTES // per_patch))
        if batch < 1:
            raise ValueError(f"batch={batch}: patches per forward pass must be at least 1")
        return batch

    def forward(self, ids: Tensor, mask: Tensor | None, **seams: Any) -> Tensor:
        """The logits (B, T or 1, V) the metric reads, of ids (B, T) under `mask`."""
        return self.model(ids, attention_mask=mask, last_logits_only=self.last, **seams).logits

    def run(self, edits: Edits) -> float:
        return self.score(self.forward(self.corrupt_ids, self.mask, edits=edits))

    def score(self, logits: Tensor) -> float:
        return float(self.scored(logits).detach())

    def scored(self, logits: Tensor) -> Tensor:
        """The metric of `logits`, a scalar tensor (with its graph, where logits have one)."""
        value = self.metric(self.nan_at_pads(logits))
        if isinstance(value, int | float):  # activation patching needs no graph
            value = torch.tensor(float(value))
        if not isinstance(value, Tensor) or value.numel() != 1:
            got = (f"a tensor of shape {tuple(value.shape)}" if isinstance(value, Tensor)
                   else f"a {type(value).__name__}")
            raise ValueError(
                f"the metric returned {got}; it must return one number (a scalar tensor): "
                "reduce over the batch, e.g. with .mean(), as logit_diff_metric does")
        if self.pads is not None and math.isnan(float(value.detach())):
            raise self.read_a_pad()
        return value.reshape(())

    def scored_copies(self, logits: Tensor, n: int) -> list[float]:
        """The metrics of n copies of the batch stacked in logits (n B, T or 1, V), read back
        at once: in one call where the metric scores copies itself (`LogitDiff.per_copy`),
        else copy by copy."""
        per_copy = getattr(self.metric, "per_copy", None)
        if per_copy is None:
            B = self.corrupt_ids.shape[0]
            return torch.stack([self.scored(logits[i * B:(i + 1) * B]).detach()
                                for i in range(n)]).tolist()
        values: list[float] = per_copy(self.nan_at_pads(logits, n), n).detach().tolist()
        if self.pads is not None and any(math.isnan(value) for value in values):
            raise self.read_a_pad()
        return values

    def nan_at_pads(self, logits: Tensor, n: int = 1) -> Tensor:
        """logits (n B, T or 1, V) of n copies of the batch, NaN at its padded positions (of
        the last columns: all, or the last alone), so a metric that reads one says so."""
        if self.pads is None:
            return logits
        pads = self.pads[:, -logits.shape[1]:].repeat(n, 1, 1)  # (n B, T or 1, 1)
        return logits.masked_fill(pads.to(logits.device), float("nan"))  # (n B, T or 1, V)

    def read_a_pad(self) -> ValueError:
        """The error for a metric that read logits at a padded position."""
        rows = self.pads[:, -1, 0].nonzero().flatten().tolist() if self.pads is not None else []
        return ValueError(
            "the metric read logits at a padded position (attention_mask 0"
            + (f"; the last column is padding in rows {rows}" if rows else "")
            + "); pad on the left, which puts every row's last token in the last column, "
            "or score real positions only")

    def effect(self, edits: Edits) -> float:
        return self.normalized(self.run(edits))

    def normalized(self, value: float) -> float:
        # + 0.0: no change over a negative gap is 0, not -0 ("-0.00" in a printout)
        return (value - self.corrupted) / (self.clean - self.corrupted) + 0.0

    def effects(self, sites: list[Site], batch: int, progress: Progress | None) -> list[float]:
        """Each site's effect patched alone, `batch` sites per forward pass: copy i of the
        corrupted batch takes site i's cells from the clean trace. With `restarts`, a pass
        starts at the lowest layer it patches (so pass sites in layer order). progress:
        heard as each pass goes (`PassProgress`)."""
        effects: list[float] = []
        groups = [sites[start:start + batch] for start in range(0, len(sites), batch)]
        firsts = [min(layer for _, layer, _ in group) for group in groups]
        passes = [(len(group), self.blocks_from(first))
                  for group, first in zip(groups, firsts, strict=True)]
        heard = PassProgress(self.model, progress, passes)
        for group, first, (n, blocks) in zip(groups, firsts, passes, strict=True):
            with heard.runs(n, blocks):
                logits = self.copies(n, first, self._edits(group))  # (n B, T or 1, V)
                effects += [self.normalized(value) for value in self.scored_copies(logits, n)]
        return effects

    def blocks_from(self, first: int) -> int:
        """The blocks a pass of `copies(..., first, ...)` runs."""
        return self.model.config.n_layer - (first if self.restarts is not None else 0)

    def copies(self, n: int, first: int, edits: Edits, trace: Trace | None = None) -> Tensor:
        """The logits (n B, T or 1, V) of n copies of the corrupted batch under `edits` (copy
        i is rows i B to (i + 1) B), run from the corrupted run's residual stream entering
        block `first` where restarts were kept, else from the embeddings."""
        mask = None if self.mask is None else self.mask.repeat(n, 1)  # (n B, S)
        start_at = None if self.restarts is None else (
            first, self.restarts.get("resid_pre", first).repeat(n, 1, 1))  # (n B, T, C)
        # ids checked by the corrupted run: no read-back of them at every pass
        return self.forward(self.corrupt_ids.repeat(n, 1), mask, edits=edits,
                            start_at=start_at, trace=trace, check_ids=False)

    def _edits(self, group: list[Site]) -> Edits:
        """One edit per (name, layer) the group patches, each over the copies that patch it."""
        B = self.corrupt_ids.shape[0]
        copies: dict[tuple[str, int], list[tuple[int, tuple[int, ...]]]] = {}
        for i, (name, layer, cell) in enumerate(group):
            copies.setdefault((name, layer), []).append((i, cell))

        def edit(name: str, layer: int, cells: list[tuple[int, tuple[int, ...]]]) -> Edit:
            clean = self.trace.get(name, layer)  # (B, nh, T, hs) or (B, T, C)

            def replace(value: Tensor, first: int) -> Tensor:
                value = value.clone()  # (n B, nh, T, hs) or (n B, T, C)
                every: tuple[slice | int, ...] = (slice(None),)
                for i, cell in cells:  # copy i's rows, then the cell from dimension 1 on
                    into: tuple[slice | int, ...] = (slice(i * B, (i + 1) * B),)
                    value[into + cell] = clean[every + cell]
                return value

            return Edit(name, layer, replace)

        return Edits([edit(name, layer, cells) for (name, layer), cells in copies.items()])


class PassProgress:
    """A `Progress` heard during each pass of patched runs, not only after it: a pass of 32
    runs of a large model is one long forward pass (seconds to minutes on a CPU). After each
    block the pass runs, its runs count as done in proportion to its blocks run (32 runs
    over 16 blocks: 2 more a block), and all of them once the pass is scored; each count
    heard once, rising, up to the runs of all `passes`. No progress: no hooks, nothing heard.

    A progress with a `work(done, total)` method hears before each count the work done: the
    blocks run, each times the runs that went through it, of all passes. Time goes with the
    work, not the runs: a pass that restarts at a later layer runs fewer blocks, and the
    passes go in layer order, so a run costs less the later it comes (a GPT-2-small-shaped
    model's last tenth of runs went 12x as fast as its first:
    docs/performance.md#patch-progress)."""

    def __init__(self, model: Any, progress: Progress | None,
                 passes: list[tuple[int, int]]) -> None:
        """passes: (runs, blocks) of each pass to come, in order, as `runs` will be told."""
        self.model, self.progress = model, progress
        self.total = sum(n for n, _ in passes)
        self.work = getattr(progress, "work", None)
        self.work_total = sum(n * blocks for n, blocks in passes)
        self.done = 0  # the runs of the passes finished
        self.heard = 0  # the count last heard
        self.worked = 0  # the work of the passes finished

    def _hear(self, progress: Progress, count: int, worked: int) -> None:
        if self.work is not None:
            self.work(worked, self.work_total)
        progress(count, self.total)

    @contextmanager
    def runs(self, n: int, blocks: int) -> Iterator[None]:
        """Inside: the forward passes of `n` runs, `blocks` blocks run in all (the blocks
        each forward pass runs, summed)."""
        progress = self.progress
        if progress is None:
            yield
            return
        ran = 0

        def block_done(*_: Any) -> None:
            nonlocal ran
            ran += 1
            count = self.done + n * min(ran, blocks) // max(blocks, 1)
            if self.heard < count < self.done + n:  # the last: after scoring, below
                self.heard = count
                self._hear(progress, count, self.worked + n * min(ran, blocks))

        hooks = [block.register_forward_hook(block_done) for block in self.model.blocks]
        try:
            yield
        finally:
            for hook in hooks:
                hook.remove()
        self.done = self.heard = self.done + n
        self.worked += n * blocks
        self._hear(progress, self.done, self.worked)
