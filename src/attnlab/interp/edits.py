"""Edits: replace what the model computes at a trace name, layer, head and position.

An `Edit` names one value of `trace.NAMES` at one layer (None for the model-level names),
optionally some heads (dimension 1 of the per-head names) and some positions, and says what
replaces those cells. `Edits` holds several; `GPT.forward(..., edits=...)` and
`generate.stream(..., edits=...)` take either: the model reports each value through the trace's
seam (`x = sink.record(name, x)`) and continues with what the edits return. Nothing is set
on the modules; an edit that selects no cell of a value returns the value itself.

Positions are sequence columns, counted from the first column of the (left-padded) input,
cached columns included: the same numbers as `attention_mask`'s columns. A decode step over
a KV cache sees only its own column (and, for "k"/"v", every column), so an edit at column 5
applies when column 5 is computed, in a prefill or a later step alike. A negative position
counts from the last column of each forward pass (TransformerLens's pos=-1): -1 is a
prompt's last token, and in generation the token each step adds. Edits of "k" and "v" are
not written into the cache; they apply again, at every call, to all the keys.

Only edits of scores or weights ("attn_scores", "masked_scores", "attn_weights",
"attn_weights_dropped") need attention's explicit path; all others keep the fused one.
The constructors below are the common cases (TransformerLens's names in brackets): zeroing,
scaling or mean-replacing heads' outputs (`hook_z` ablation), zeroing MLP neurons
(`mlp.hook_post`) or a mixture's experts, uniform or given attention patterns, and patching a
value from another run's `Trace` (activation patching). Which heads to edit is `heads.py`'s
business; what to patch and how to score it, `patching.py`'s.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import torch
from torch import Tensor

from ..model.gpt import require_eval
from ..model.names import (
    HEAD_NAMES,
    MODEL_NAMES,
    NAMES,
    SUMMARIES,
    WEIGHT_NAMES,
    absent_names,
    position_dim,
)
from ..model.trace import Trace, indices

if TYPE_CHECKING:
    from ..model.config import GPTConfig

_KV_NAMES = frozenset({"k_pre_rope", "k", "v"})  # heads: the key/value heads
_EMBEDDINGS = frozenset({"tok_emb", "pos_emb", "emb"})  # before block 0

#: (value, first column of its position dimension) -> a tensor of the same shape whose
#: selected cells replace the value's.
Replacement = Callable[[Tensor, int], Tensor]


@dataclass(frozen=True)
class Edit:
    """Replace cells of one named value during a forward pass.

    name: a trace name (`trace.NAMES`). layer: the block index; None for the model-level
    names (tok_emb, pos_emb, emb, logits). heads: head indices (per-head names only);
    None = all. positions: sequence columns (see the module docstring); None = all.
    replace: (value, first column) -> same-shaped replacement; only selected cells are used.
    fits: raises ValueError unless the edit fits a model of this config (`Edits.check` calls
    it before any pass: what `replace` selects beyond heads and positions, e.g. neurons).
    """

    name: str
    layer: int | None
    replace: Replacement
    heads: tuple[int, ...] | None = None
    positions: tuple[int, ...] | None = None
    fits: Callable[[GPTConfig], None] | None = None

    def __repr__(self) -> str:  # the replace function's repr says nothing
        where = "" if self.layer is None else f", layer={self.layer}"
        # "zero_heads", not "zero_heads.<locals>.<lambda>"
        made_by = str(getattr(self.replace, "__qualname__", self.replace)).split(".<locals>")[0]
        return (f"Edit({self.name!r}{where}, heads={self.heads}, positions={self.positions}, "
                f"replace={made_by})")

    def __post_init__(self) -> None:
        if self.name not in NAMES:
            raise ValueError(f"unknown edit name {self.name!r}; known names: {sorted(NAMES)}")
        if self.name in SUMMARIES:
            raise ValueError(f"{self.name!r} is a summary the model never reads, so editing it "
                             "changes nothing; edit 'attn_weights' instead")
        if (self.layer is None) != (self.name in MODEL_NAMES):
            want = "layer=None" if self.name in MODEL_NAMES else "a layer index"
            raise ValueError(f"edit of {self.name!r} at layer {self.layer}: it needs {want}")
        if self.heads is not None and self.name not in HEAD_NAMES:
            raise ValueError(
                f"{self.name!r} has no head dimension; edit heads through one of "
                f"{sorted(HEAD_NAMES)} (a head's output is 'context')"
            )
        if self.layer is not None and (isinstance(self.layer, bool) or not hasattr(
                self.layer, "__index__") or self.layer < 0):
            raise ValueError(f"edit of {self.name!r} at layer {self.layer!r}: layers are "
                             "integers from 0 (the last one is n_layer - 1)")
        # plain ints, refused by name otherwise: a float position would be truncated
        for what, negative in (("heads", False), ("positions", True)):
            given = getattr(self, what)
            if given is not None:
                object.__setattr__(self, what, tuple(indices(what, given, negative,
                                                             owner="Edit")))
        if self.layer is not None:
            object.__setattr__(self, "layer", self.layer.__index__())

    # One edit is also a set of one (model.trace.EditSource), so `edits=zero_heads(0, 1)`
    # works wherever `edits=Edits([...])` does.
    def check(self, config: GPTConfig, start: int | None = None) -> None:
        Edits([self]).check(config, start)

    def touches(self, layer: int | None) -> bool:
        return layer is None or layer == self.layer

    def needs_weights(self, layer: int | None) -> bool:
        return layer == self.layer and self.name in WEIGHT_NAMES

    def apply(self, name: str, value: Tensor, layer: int | None, length: int) -> Tensor:
        return self.edited(value, length) if (layer, name) == (self.layer, self.name) else value

    def __add__(self, other: Edit | Edits) -> Edits:
        return Edits([self, other])

    def edited(self, value: Tensor, length: int) -> Tensor:
        """The edited value; `length` = columns of the forward pass (cached + new)."""
        dim = position_dim(self.name)
        first = length - value.shape[dim]  # k/v hold every column, the others the last ones
        select = torch.ones((1,) * value.dim(), dtype=torch.bool, device=value.device)
        if self.heads is not None:
            n = value.shape[1]
            bad = [h for h in self.heads if not 0 <= h < n]
            if bad:
                raise ValueError(f"edit heads {bad} out of range for {n} heads in {self.name!r}")
            shape = [1] * value.dim()
            shape[1] = n
            on = torch.zeros(n, dtype=torch.bool, device=value.device)
            on[list(self.heads)] = True
            select = select & on.view(shape)  # (1, nh, 1, ...)
        if self.positions is not None:
            before = [p for p in self.positions if p < -length]
            if before:
                raise ValueError(f"edit of {self.name!r} at positions {before}: they count back "
                                 f"from the last of this pass's {length} columns, past its "
                                 f"first; count from -1 (the last) to -{length}")
            columns = [p - first for p in _columns(self.positions, length)
                       if first <= p < length]
            if not columns:
                return value  # none of the edited columns is computed in this call
            shape = [1] * value.dim()
            shape[dim] = value.shape[dim]
            on = torch.zeros(value.shape[dim], dtype=torch.bool, device=value.device)
            on[columns] = True
            select = select & on.view(shape)  # (1, ..., T, 1, ...)
        replacement = self.replace(value, first)
        if replacement.shape != value.shape:
            raise ValueError(
                f"replacement for {self.name!r} at layer {self.layer} has shape "
                f"{tuple(replacement.shape)}, the value {tuple(value.shape)}"
            )
        if self.heads is None and self.positions is None:
            return replacement.to(value.dtype)
        return torch.where(select, replacement.to(value.dtype), value)


class Edits:
    """A set of `Edit`s, applied in order: `GPT.forward(idx, edits=Edits([...]))`. Sets in
    the list are flattened into it; `a + b` joins edits and sets too."""

    def __init__(self, edits: Iterable[Edit | Edits] = ()) -> None:
        given = [edits] if isinstance(edits, Edit | Edits) else edits
        self.edits: list[Edit] = [
            e for x in given for e in (x.edits if isinstance(x, Edits) else [x])
        ]
        bad = [x for x in self.edits if not isinstance(x, Edit)]
        if bad:
            raise TypeError(f"Edits holds Edit and Edits values, not {bad[0]!r}; make edits "
                            "with zero_heads, scale_heads, patch, ... or Edit(...)")
        self._by_site: dict[tuple[int | None, str], list[Edit]] = {}
        for edit in self.edits:
            self._by_site.setdefault((edit.layer, edit.name), []).append(edit)
        self._layers = {e.layer for e in self.edits}
        self._weight_layers = {e.layer for e in self.edits if e.name in WEIGHT_NAMES}

    def __add__(self, other: Edits | Edit) -> Edits:
        return Edits([self, other])

    def __len__(self) -> int:
        return len(self.edits)

    def __repr__(self) -> str:
        return f"Edits([{', '.join(map(repr, self.edits))}])"

    def check(self, config: GPTConfig, start: int | None = None) -> None:
        """Raise unless every edit is at a layer and heads the model has and at positions
        below its block_size: an edit no forward pass reaches would leave the model
        unchanged, which reads as "this part does not matter". (A position past this call's
        columns is allowed: a later call, with a cache or a longer input, computes it.) A pass
        that starts at block `start` (`GPT.forward(start_at=...)`) reaches no embedding and no
        earlier block either."""
        n_layer, block_size = config.n_layer, config.block_size
        absent = absent_names(config)
        for edit in self.edits:
            if edit.name in absent:
                raise ValueError(f"edit of {edit.name!r}: this model never computes it, as "
                                 f"{absent[edit.name]}, so the edit would change nothing")
            if edit.layer is not None and edit.layer >= n_layer:
                raise ValueError(f"edit of {edit.name!r} at layer {edit.layer}: the model has "
                                 f"{n_layer} layers (0 to {n_layer - 1})")
            if start is not None and (edit.name in _EMBEDDINGS if edit.layer is None
                                      else edit.layer < start):
                raise ValueError(f"edit of {edit.name!r}" + ("" if edit.layer is None else
                                 f" at layer {edit.layer}") + f": this pass starts at block "
                                 f"{start} (start_at), after it; edit a later value or run "
                                 "the whole model")
            if edit.fits is not None:
                edit.fits(config)
            n = config.n_kv_heads if edit.name in _KV_NAMES else config.n_head
            bad = [h for h in edit.heads or () if not 0 <= h < n]
            if bad:
                raise ValueError(f"edit heads {bad} out of range for {n} heads in {edit.name!r}")
            beyond = [p for p in edit.positions or () if not -block_size <= p < block_size]
            if beyond:
                raise ValueError(f"edit of {edit.name!r} at positions {beyond}: the model "
                                 f"reads at most block_size={block_size} columns (0 to "
                                 f"{block_size - 1}, or -1 to -{block_size} from the last)")

    def touches(self, layer: int | None) -> bool:
        return layer is None or layer in self._layers

    def needs_weights(self, layer: int | None) -> bool:
        return layer in self._weight_layers

    def apply(self, name: str, value: Tensor, layer: int | None, length: int) -> Tensor:
        for edit in self._by_site.get((layer, name), ()):
            value = edit.edited(value, length)
        return value


def _columns(positions: Iterable[int], length: int) -> list[int]:
    """Edit positions as columns of a pass over `length` columns (cached + new): a negative
    one counts from the last (-1: the newest)."""
    return [p + length if p < 0 else p for p in positions]


def _tuple(xs: int | Iterable[int] | None) -> tuple[int, ...] | None:
    """Heads or positions as `Edit` holds them (it checks them): one int is a tuple of one."""
    if xs is None:
        return None
    return (xs,) if not isinstance(xs, Iterable) else tuple(xs)


# ----------------------------------------------------------------------------- MLP neurons


def zero_neurons(
    layer: int, neurons: int | Iterable[int], positions: Iterable[int] | None = None
) -> Edit:
    """Zero-ablate MLP neurons: their hidden activations ("mlp_hidden", TransformerLens's
    mlp.hook_post) become 0, so they write nothing into the residual stream through the down
    projection (its bias still does)."""
    chosen = indices("neurons", neurons, owner="zero_neurons")  # numpy's and torch's ints too
    return _zero_columns("mlp_hidden", layer, chosen, positions, "neurons",
                         lambda c: (c.ff_size, "MLP neurons"))


def zero_experts(
    layer: int, experts: int | Iterable[int], positions: Iterable[int] | None = None
) -> Edit:
    """Ablate experts of a mixture: their weights ("expert_weights") become 0, so they write
    nothing for the tokens that chose them; the other chosen experts keep their weights."""
    chosen = indices("experts", experts, owner="zero_experts")
    # a model without a mixture: `absent_names` refuses the edit first
    return _zero_columns("expert_weights", layer, chosen, positions, "experts",
                         lambda c: (c.n_experts or 0, "experts"))


def _zero_columns(name: str, layer: int, chosen: list[int], positions: Iterable[int] | None,
                  what: str, size: Callable[[GPTConfig], tuple[int, str]]) -> Edit:
    """An edit zeroing the `chosen` entries of `name`'s last dimension at `layer`; `size`
    gives a config's count of them and what they are, for the range check."""

    def fits(config: GPTConfig) -> None:
        n, kind = size(config)
        bad = [i for i in chosen if not 0 <= i < n]
        if bad:
            raise ValueError(f"{what} {bad} out of range for layer {layer}'s {n} {kind} "
                             f"(0 to {n - 1})")

    def replace(v: Tensor, _: int) -> Tensor:
        out = v.clone()  # (B, T, d_ff or n_experts)
        out[..., chosen] = 0
        return out

    return Edit(name, layer, replace, None, _tuple(positions), fits)


# ----------------------------------------------------------------------------- head outputs


def zero_heads(
    layer: int, heads: int | Iterable[int], positions: Iterable[int] | None = None
) -> Edit:
    """Zero-ablate heads: their output ("context", TransformerLens's hook_z) becomes 0."""
    return Edit("context", layer, lambda v, _: torch.zeros_like(v), _tuple(heads),
                _tuple(positions))


def scale_heads(
    layer: int, heads: int | Iterable[int], factor: float,
    positions: Iterable[int] | None = None,
) -> Edit:
    """Multiply heads' outputs ("context") by `factor` (1.0 leaves them bit for bit)."""
    return Edit("context", layer, lambda v, _: v * factor, _tuple(heads), _tuple(positions))


def mean_heads(
    layer: int, heads: int | Iterable[int], mean: Tensor,
    positions: Iterable[int] | None = None,
) -> Edit:
    """Mean-ablate heads: their output becomes `mean` (nh, hs), e.g. from `head_means`."""
    if mean.dim() != 2:
        raise ValueError(f"mean must be (nh, hs) from head_means, got {tuple(mean.shape)}")

    def replace(v: Tensor, _: int) -> Tensor:
        if mean.shape != (v.shape[1], v.shape[-1]):
            raise ValueError(f"mean has shape {tuple(mean.shape)}, layer {layer}'s heads "
                             f"({v.shape[1]}, {v.shape[-1]}) = (nh, hs); pass "
                             f"head_means(model, reference_ids)[{layer}] of this model")
        return mean[None, :, None, :].to(v).expand_as(v)  # (1, nh, 1, hs) -> (B, nh, T, hs)

    return Edit("context", layer, replace, _tuple(heads), _tuple(positions))


@torch.no_grad()
def head_means(model: torch.nn.Module, idx: Tensor, attention_mask: Tensor | None = None
               ) -> list[Tensor]:
    """Per layer, each head's mean output (nh, hs) over every real token of a reference
    batch idx (B, T): what `mean_heads` puts in place of a head."""
    require_eval(model, "the head means")
    trace = Trace(names=["context"]).run(model, idx, attention_mask)  # type: ignore[arg-type]
    means = []
    for layer in range(len(model.blocks)):  # type: ignore[arg-type]
        context = trace.get("context", layer)  # (B, nh, T, hs)
        if attention_mask is None:
            means.append(context.mean(dim=(0, 2)))  # (nh, hs)
        else:
            real = attention_mask.to(context).bool()[:, None, :, None]  # (B, 1, T, 1)
            total = (context * real).sum(dim=(0, 2))  # (nh, hs)
            means.append(total / real.sum().clamp(min=1))
    return means


def ablate(
    heads: tuple[int, int] | Iterable[tuple[int, int]], how: str = "zero",
    means: Sequence[Tensor] | None = None,
) -> Edits:
    """Edits that ablate each (layer, head) (one pair, or a list of them): how = "zero" or
    "mean" (needs `means`)."""
    one = isinstance(heads, tuple) and len(heads) == 2 and all(isinstance(x, int) for x in heads)
    listed: list[tuple[int, int]] = (
        [cast(tuple[int, int], heads)] if one else list(cast(Iterable[tuple[int, int]], heads)))
    bad = [p for p in listed if not (isinstance(p, Sequence) and len(p) == 2
                                     and all(hasattr(x, "__index__") for x in p))]
    if bad:
        raise ValueError(f"heads must be (layer, head) pairs, e.g. [(0, 1), (1, 3)]; got "
                         f"{bad[0]!r} in {heads!r}")
    pairs = sorted({(int(layer), int(head)) for layer, head in listed})  # lists from JSON too
    by_layer: dict[int, list[int]] = {}
    for layer, head in pairs:
        by_layer.setdefault(layer, []).append(head)
    if how == "zero":
        return Edits(zero_heads(layer, hs) for layer, hs in by_layer.items())
    if how == "mean":
        if means is None:
            raise ValueError("mean ablation needs means=head_means(model, reference_ids)")
        return Edits(mean_heads(layer, hs, means[layer]) for layer, hs in by_layer.items())
    raise ValueError(f"ablation how={how!r} must be 'zero' or 'mean'")


def parse_heads(text: str) -> list[tuple[int, int]]:
    """"1.0,0.3" -> [(1, 0), (0, 3)]: layer.head pairs, as the CLI's --ablate takes them."""
    pairs = []
    for part in text.split(","):
        match = re.fullmatch(r"\s*(\d+)\.(\d+)\s*", part)
        if match is None:
            raise ValueError(
                f"bad head {part!r} in {text!r}; write LAYER.HEAD pairs separated by commas, "
                "e.g. 1.0,1.3"
            )
        pairs.append((int(match.group(1)), int(match.group(2))))
    return pairs


def check_heads(heads: Iterable[tuple[int, int]], n_layer: int, n_head: int) -> None:
    """ValueError naming any (layer, head) the model does not have."""
    bad = [(la, h) for la, h in heads if not (0 <= la < n_layer and 0 <= h < n_head)]
    if bad:
        raise ValueError(
            f"(layer, head) {', '.join(map(str, bad))} do not exist: the model has layers "
            f"0-{n_layer - 1} and heads 0-{n_head - 1}"
        )


# ----------------------------------------------------------------------------- attention


def uniform_attention(
    layer: int, heads: int | Iterable[int], positions: Iterable[int] | None = None
) -> Edit:
    """Heads attend uniformly over the keys each query may see: every finite masked score
    becomes 0 (masked cells stay -inf), so the softmax spreads evenly."""

    def replace(v: Tensor, _: int) -> Tensor:
        return torch.where(torch.isneginf(v), v, torch.zeros_like(v))

    return Edit("masked_scores", layer, replace, _tuple(heads), _tuple(positions))


def set_attention(layer: int, heads: int | Iterable[int], weights: Tensor) -> Edit:
    """Heads use the given attention weights: (S, S) or (B, S, S) over all columns (rows are
    queries); a cached step takes the rows it computes. Rows should sum to 1 over keys the
    query may see (not checked: a pattern is the caller's experiment)."""
    if weights.dim() not in (2, 3) or weights.shape[-1] != weights.shape[-2]:
        raise ValueError(f"set_attention weights must be (S, S) or (B, S, S) over all "
                         f"columns, got shape {tuple(weights.shape)}")

    def replace(v: Tensor, first: int) -> Tensor:
        T, S = v.shape[-2:]
        if weights.shape[-1] < S:
            raise ValueError(f"set_attention weights cover {weights.shape[-1]} columns, this "
                             f"forward pass {S}; give a pattern over every column")
        if weights.dim() == 3 and weights.shape[0] not in (1, v.shape[0]):
            raise ValueError(f"set_attention weights hold {weights.shape[0]} rows' patterns, "
                             f"this forward pass {v.shape[0]} rows; give (S, S) for every "
                             "row or (B, S, S), one per row")
        w = weights[..., first:first + T, :S]  # (T, S) or (B, T, S)
        w = w[:, None] if w.dim() == 3 else w  # (B, 1, T, S)
        return w.to(v).expand_as(v)  # (B, nh, T, S)

    return Edit("attn_weights", layer, replace, _tuple(heads))


# ----------------------------------------------------------------------------- patching


def patch(
    source: Trace,
    name: str,
    layer: int | None,
    heads: int | Iterable[int] | None = None,
    positions: Iterable[int] | None = None,
) -> Edit:
    """Activation patching: the selected cells take their values from another run's trace
    (same batch size; the source trace must hold `name` at `layer`, all heads). Columns pair
    by absolute position: a run shorter than the source takes its first columns, and a run
    longer than the source, such as generation past the traced prompt, may patch only
    positions inside the source; the same edit gives the same tokens cached or recomputed."""
    stored = source.get(name, layer)
    dim = position_dim(name)
    selected = _tuple(positions)

    def replace(v: Tensor, first: int) -> Tensor:
        T, have = v.shape[dim], stored.shape[dim]
        if stored.shape[:dim] + stored.shape[dim + 1:] != v.shape[:dim] + v.shape[dim + 1:]:
            raise ValueError(
                f"patch source {name!r}@{layer} has shape {tuple(stored.shape)}, which does not "
                f"cover the patched run's {tuple(v.shape)} (trace the source with the same "
                "batch size and length, every head)"
            )
        wanted = range(first, first + T) if selected is None else _columns(selected,
                                                                              first + T)
        missing = [p for p in wanted if have <= p < first + T]
        if missing:  # e.g. generation past the traced prompt
            raise ValueError(
                f"patch source {name!r}@{layer} holds columns 0 to {have - 1}, and this run "
                f"patches columns {missing} too; pass positions inside the source (e.g. "
                f"positions=range({have})) or trace a source as long as the run"
            )
        if first + T <= have:  # the whole run, or a cached step's own columns
            return stored.narrow(dim, first, T).to(v)
        # the source's part of this call's columns, then the run's own (none of them selected)
        inside = max(0, have - first)
        return torch.cat([stored.narrow(dim, min(first, have), inside).to(v),
                          v.narrow(dim, inside, T - inside)], dim=dim)

    return Edit(name, layer, replace, _tuple(heads), _tuple(positions))
