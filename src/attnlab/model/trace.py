"""Capture of every intermediate of a forward pass, stored for inspection.

A `Trace` is an object passed into `GPT.forward(..., trace=trace)`; nothing is stored on
the modules. The model reports each named value through one seam, `x = sink.record(name, x)`:
a trace keeps a copy and returns `x` unchanged; edits (`interp/edits.py`, passed as
`GPT.forward(..., edits=...)`) may return a replacement, which the model continues with.
`Seam` joins both for one forward pass: edits apply first, so a trace sees what the model
used. Attention runs its explicit (reference) path only where a sink needs raw scores,
masked scores, weights or their per-head summaries (`needs_weights`; the summaries alone
are streamed in tiles, `summaries.py`); everything else keeps the fused path, and
layers no sink touches run as if there were none. `Trace.run` ends the forward pass once the
trace holds all it will keep (the seam raises after the last value). This module owns what
is captured and how it is filtered, and which cells a traced pass masked (`Trace.may_attend`,
for the figures and the view); the names are `names.py`'s, what an edit does is
`interp/edits.py`'s, drawing `viz`'s.

Names and shapes (vocabulary in `attention.py`; heads dimension nh is sliced by `heads`):
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

import torch
from torch import Tensor

from .masks import causal_mask, padding_of_row, query_rows
from .names import (
    HEAD_NAMES,
    MODEL_NAMES,
    NAMES,
    SUMMARIES,
    WEIGHT_NAMES,
    absent_names,
)

if TYPE_CHECKING:
    from .config import GPTConfig
    from .gpt import GPT
    from .masks import Mask

_Trace = TypeVar("_Trace", bound="Trace")

#: Per-head names of the weights (query heads only), which attention makes for the kept
#: heads alone when a trace keeps some heads (`attention.LayerTrace.heads`).
_QUERY_HEAD_NAMES = WEIGHT_NAMES | SUMMARIES
#: Names whose values may be views into a KV cache: a trace always copies them.
_CACHE_NAMES = frozenset({"k", "v"})
_ORDER = {name: i for i, name in enumerate(NAMES)}
__doc__ = (__doc__ or "") + "\n".join(f"    {n:22s} {s}" for n, s in NAMES.items())


class EditSource(Protocol):
    """What the seam needs from edits (`interp.edits.Edits`): which layers they touch, whether
    they need attention's explicit path there, and the edited value; `check` refuses layers
    and positions the model never reaches (in a pass that starts at block `start`, the
    embeddings and earlier blocks too). `length` is the number of sequence columns
    (cached + new) the forward pass covers, so an edit can tell which absolute positions a
    value's position dimension holds (its last entries)."""

    def check(self, config: GPTConfig, start: int | None = None) -> None: ...

    def touches(self, layer: int | None) -> bool: ...

    def needs_weights(self, layer: int | None) -> bool: ...

    def apply(self, name: str, value: Tensor, layer: int | None, length: int) -> Tensor: ...


class _LayerView:
    """The `value = record(name, value)` sink handed to one layer: edits, then the trace."""

    def __init__(
        self, trace: Trace | None, edits: EditSource | None, layer: int | None, length: int
    ) -> None:
        self.trace, self.edits, self.layer, self.length = trace, edits, layer, length
        edits_weights = edits is not None and edits.needs_weights(layer)
        self.needs_weights = (trace is not None and trace.needs_weights) or edits_weights
        # an edit of scores or weights needs every head's and row's; else only the trace's count
        self.heads = None if trace is None or edits_weights else trace.heads
        self.rows = None if trace is None or edits_weights else trace.rows

    def wants(self, name: str) -> bool:
        """True when the trace keeps `name` or an edit may change it (attention computes the
        (B, nh, T, S) scores only for a sink that wants them)."""
        if self.trace is not None and self.trace.wants(name):
            return True
        return self.edits is not None and name in WEIGHT_NAMES and self.edits.needs_weights(
            self.layer)

    def may_see(self, name: str) -> bool:
        """True when the trace keeps `name` or an edit touches this layer: a value that a
        fused kernel never holds (the MLP's pre-activations) must then be made on its own."""
        return (self.trace is not None and self.trace.wants(name)) or self.edits is not None

    def record(self, name: str, value: Tensor) -> Tensor:
        if self.edits is not None:
            value = self.edits.apply(name, value, self.layer, self.length)
        if self.trace is not None:
            self.trace.record(name, value, self.layer)
            last = self.trace.last_place
            if last is not None and (-1 if self.layer is None else self.layer,
                                     _ORDER[name]) >= last:
                raise _Enough  # Trace.run: nothing after this point is kept
        return value

    def note_mask(self, mask: Mask) -> None:
        if self.trace is not None:
            self.trace.note_mask(mask, self.layer)

    def named(self, name: str) -> bool:
        return self.trace is not None and self.trace.named(name)


@dataclass(frozen=True)
class Masked:
    """How attention masked one layer's last traced pass (`Mask`'s fields): causal, True for
    the causal mask (queries the last T keys) within `window`, False for the padding alone (an
    encoder's, cross-attention's, or no mask), None for a mask of another shape; padding
    (B, S) bool, True for real keys, or None."""

    causal: bool | None
    window: int | None
    padding: Tensor | None

    @classmethod
    def of(cls, mask: Mask) -> Masked:
        """What `mask` masks, its padding copied (a caller may write the next step's mask into
        the same buffer)."""
        causal = False if mask.causal is None and mask.may_attend is None else mask.causal
        padding = None if mask.padding is None else mask.padding.detach().clone()  # (B, S)
        return cls(causal, mask.window, padding)


class _Enough(Exception):
    """Raised by the seam once a `Trace.run` trace holds all it will keep."""


class Seam:
    """A trace, edits, or both, for one forward pass over `length` columns (cached + new):
    what `GPT.forward` reports its values to."""

    def __init__(self, trace: Trace | None, edits: EditSource | None, length: int) -> None:
        self.trace, self.edits, self.length = trace, edits, length
        self._model = _LayerView(trace, edits, None, length)

    def layer(self, index: int) -> _LayerView | None:
        """The sink for layer `index`, or None when neither the trace nor an edit wants it
        (that layer then runs exactly as without a seam)."""
        trace = self.trace
        if trace is not None and trace.layers is not None and index not in trace.layers:
            trace = None
        edits = self.edits if self.edits is not None and self.edits.touches(index) else None
        if trace is None and edits is None:
            return None
        return _LayerView(trace, edits, index, self.length)

    def record(self, name: str, value: Tensor) -> Tensor:
        """A model-level value (layer None): embeddings, logits."""
        return self._model.record(name, value)


class Trace:
    """Stores detached named intermediates, keyed by (layer, name).

    A value is kept as the model made it, without a copy, unless it is a view into memory
    that others write (keys and values in a KV cache, which later steps overwrite): the
    model never changes a tensor in place once it has recorded it, and a copy would write
    every layer's (B, nh, T, S) weights into fresh pages a second time
    (docs/performance.md#kept-buffers).
    Scores and weights of 4 MiB and more live in buffers (`runtime.kept_empty`) that serve
    the next trace once nothing reads them: after `del trace` the process keeps that memory
    (up to 2 GiB) for the next one; `attnlab.model.runtime.release_kept_memory()` frees it.
    After a pass, `windows` and `attention_mask` hold what it masked (`begin`), and `masked`
    each traced layer's mask (`note_mask`: causal or not, window, padding).

    Args:
        layers: layer indices to capture (None: all; one int: that layer). Other layers run
            untraced.
        heads: head indices kept for per-head tensors (None: all; one int: that head), in
            ascending order: Trace(heads=[3, 1]) keeps head 1 at index 0 of dimension 1.
            The weights and summaries of the other heads are not computed unless an edit or
            the raw scores need them (their context comes from the fused path).
        names: names to keep (None: all of `NAMES`; one string: that name).
        rows: query rows of each pass whose scores and weights (`WEIGHT_NAMES`: dimension 2)
            are kept (None: all; one int: that row; negative counts from the last, -1 the
            last), in ascending order: Trace(rows=-1, names="attn_weights") keeps the last
            token's (B, nh, 1, S) weights. The other rows' weights are not computed unless
            an edit or the raw scores need them; every row's context comes from the fused
            path, and summaries cover every row.
        dtype: floating dtype to store floating values in (None: as computed). float16
            halves a float32 trace; it rounds attention weights (in [0, 1]) by at most
            2**-12 (2.4e-4) absolute, and scores by 2**-11 relative; a value past the dtype's
            range is stored as its largest finite value (+-65504 in float16), so only a
            masked score is -inf (`may_attend`).
    """

    def __init__(
        self,
        layers: int | Iterable[int] | None = None,
        heads: int | Iterable[int] | None = None,
        names: str | Iterable[str] | None = None,
        *,
        rows: int | Iterable[int] | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        if dtype is not None and not dtype.is_floating_point:
            raise ValueError(f"Trace dtype={dtype} must be a floating dtype, e.g. torch.float16")
        self.dtype = dtype
        self._query_heads: dict[int | None, int] = {}
        # one layer, head or name stands for a list of one (Trace(layers=0, names="q"))
        self.layers = None if layers is None else frozenset(indices("layers", layers))
        self.heads = None if heads is None else sorted(set(indices("heads", heads)))
        self.rows = None if rows is None else tuple(indices("rows", rows, negative=True))
        self._query_rows: dict[int | None, int] = {}  # T of each layer's last pass
        if names is not None:
            names = frozenset((names,) if isinstance(names, str) else names)
            unknown = sorted(names - NAMES.keys())
            if unknown:
                raise ValueError(f"unknown trace names {unknown}; known names: {sorted(NAMES)}")
            if not names:
                raise ValueError("Trace(names=[]) would keep nothing; name what to keep, or "
                                 "pass names=None for every name")
        self.names = names
        # scores and weights exist only on attention's explicit path: run it when they are
        # wanted, and keep the fused path for a trace of, say, the residual stream
        self.needs_weights = names is None or bool(names & (WEIGHT_NAMES | SUMMARIES))
        self.values: dict[tuple[int | None, str], Tensor] = {}
        # (layer or -1, index in NAMES) of the last value kept: set only while `run` runs
        self.last_place: tuple[int, int] | None = None
        # what the last traced pass masked, which its weights cannot tell a reader (the view):
        # a masked key's weight is 0 like one that underflows. Each layer's sliding window
        # (None: whole context) and the (B, S) padding over cached + new keys (True = token,
        # False = pad; None: no padding)
        self.windows: dict[int, int | None] = {}
        self.attention_mask: Tensor | None = None
        self.masked: dict[int | None, Masked] = {}
        self.absent: dict[str, str] = {}  # names the last traced model never computes

    def run(self: _Trace, model: GPT, idx: Tensor, attention_mask: Tensor | None = None, *,
            edits: EditSource | None = None) -> _Trace:
        """Run `model` on idx (B, T), without autograd, only as far as this trace keeps
        values, and return the trace. A trace of the attention weights skips the last
        layer's context and MLP and the head (the logits, a large share of a long forward:
        docs/performance.md#skipping-the-head), `Trace(layers=0, names=["attn_weights"])`
        runs one block. The layer filter leaves the model-level names (embeddings, logits)
        in, so `Trace(layers=0)` alone keeps the logits and runs every block and the head. Take
        `model(idx, trace=trace)` where you want the logits too; those values are the same.
        The model runs in the mode it is in: in training mode dropout applies (and
        `attn_weights_dropped` exists), so call `model.eval()` first for the weights it
        computes at inference. idx and attention_mask may be on the host: they are moved to
        the model's device.
        """
        names = NAMES.keys() if self.names is None else self.names
        layers = range(model.config.n_layer) if self.layers is None else self.layers
        places = [(-1 if n in MODEL_NAMES else max(layers), _ORDER[n]) for n in names
                  if n in MODEL_NAMES or layers]
        self.last_place = None if "logits" in names else max(places, default=(-1, -1))
        try:
            with torch.no_grad():
                model(idx.to(model.wte.weight.device), attention_mask=attention_mask,
                      trace=self, edits=edits)
        except _Enough:
            pass
        finally:
            self.last_place = None
        return self

    def begin(self, config: GPTConfig, attention_mask: Tensor | None) -> None:
        """Called by `GPT.forward` before a traced pass: check the filters against the model
        and note each layer's sliding window (`windows`) and the pass's padding."""
        self.check_filters(config)
        self.absent = absent_names(config)
        if self.names is not None and self.names <= self.absent.keys():
            why = "; ".join(f"{n}: {self.absent[n]}" for n in sorted(self.names))
            raise ValueError(f"Trace(names={sorted(self.names)}) would keep nothing: this "
                             f"model never computes {'it' if len(self.names) == 1 else 'them'}"
                             f" ({why})")
        self.windows = {i: config.window_of(i) for i in range(config.n_layer)}
        self.masked = {}  # each traced layer notes its own in this pass
        # a copy: a caller may write the next step's mask into the same buffer
        self.attention_mask = None if attention_mask is None else attention_mask.detach().to(
            torch.bool, copy=True)  # (B, S)

    def may_attend(self, layer: int | None, row: int = 0, *,
                   attention_mask: Tensor | None = None) -> Tensor:
        """(T, S) bool on the CPU, True where a query of batch `row` may attend a key in
        `layer`: what the model masked, which the weights cannot tell (a masked key's weight
        is 0 like one that underflows). From the masked scores when the trace kept them,
        else rebuilt as the layer's mask was (`masked`): the causal mask (queries are the
        last T of S keys) within its sliding window, or none (an encoder, cross-attention),
        and the padding: `attention_mask` (B, S) or (S,), default the pass's own; (rows, S)
        for a trace with a row filter. The figures (`viz`) hatch and the view
        (`viewer/notebook.py`) greys its False cells.
        """
        if (layer, "masked_scores") in self:
            return ~self.get("masked_scores", layer)[row, 0].isneginf().cpu()  # (T, S)
        held = [self.get(n, layer) for n in sorted(WEIGHT_NAMES) if (layer, n) in self]
        if not held:
            raise ValueError(f"trace has no scores or weights for layer {layer}, so no (T, S) "
                             "to mask; trace attn_weights (or masked_scores) of that layer")
        T, S = held[0].shape[-2:]
        rows = None
        if self.rows is not None:  # the weights hold these rows of the pass's queries
            T = self._query_rows.get(layer, T)
            rows = query_rows(self.rows, T)
        # a layer traced before its mask was noted: the model's causal mask and windows
        masked = self.masked.get(layer) or Masked(
            True, None if layer is None else self.windows.get(layer), None)
        if masked.causal is None:
            raise ValueError(f"layer {layer} attended under a mask build_mask did not make, "
                             "which the trace cannot rebuild; trace masked_scores too")
        if masked.causal:
            # the window in cache slots, as build_mask counts it (a left-padded row's tokens
            # are contiguous, so slot distance is position distance)
            may = causal_mask(T, S, window=masked.window, rows=rows)  # (T or rows, S)
        else:
            may = torch.ones(T if rows is None else len(rows), S, dtype=torch.bool)
        if attention_mask is None:
            attention_mask = self.attention_mask if masked.padding is None else masked.padding
        if attention_mask is not None:
            pad = padding_of_row(attention_mask, row, S, of="keys")  # (S,)
            may = may & pad.bool().cpu()[None, :]  # (T or rows, S)
        return may

    def note_mask(self, mask: Mask, layer: int | None = None) -> None:
        """Keep how `mask` masked `layer`'s pass (`masked`), for `may_attend`."""
        self.masked[layer] = Masked.of(mask)

    def check_filters(self, config: GPTConfig) -> None:
        """Raise unless the layer and head filters name layers and query heads the model has
        (a trace of layer 7 on a 4-layer model would record nothing and fail only at get())."""
        for what, chosen, n in (("layers", self.layers, config.n_layer),
                                ("heads", self.heads, config.n_head)):
            bad = sorted(i for i in chosen or () if not 0 <= i < n)
            if bad:
                raise ValueError(f"Trace({what}={sorted(chosen or ())}): the model has {n} "
                                 f"{what} (0 to {n - 1}); {bad} are not among them")

    def layer(self, index: int) -> _LayerView | None:
        """The sink for layer `index`, or None when the filter leaves that layer out."""
        return Seam(self, None, 0).layer(index)

    def wants(self, name: str) -> bool:
        """True when the filters keep `name`."""
        return self.names is None or name in self.names

    def named(self, name: str) -> bool:
        """True when `names` lists `name` itself (not None, every name)."""
        return self.names is not None and name in self.names

    def record(self, name: str, value: Tensor, layer: int | None = None) -> Tensor:
        """Keep `value`, detached, under (layer, name) if the filters want it, and return
        `value` unchanged (the seam's protocol: the model continues with it).

        A `Trace` handed straight to a standalone `CausalSelfAttention` records at layer None.
        """
        if name not in NAMES:
            raise ValueError(f"unknown trace name {name!r}; known names: {sorted(NAMES)}")
        if name in ("q", "q_pre_rope"):  # query heads of this layer (k/v may have fewer: GQA)
            self._query_heads[layer], self._query_rows[layer] = value.shape[1], value.shape[2]
        if not self.wants(name):
            return value
        kept = value.detach()
        # copy what may be memory others write: keys and values (a KV cache's buffers, which
        # later steps overwrite) and any part of a larger buffer (inference mode keeps no
        # record of which tensors are views, so ask the storage)
        copy = name in _CACHE_NAMES or (
            kept.untyped_storage().nbytes() > kept.numel() * kept.element_size()
        )
        if self.heads is not None and name in HEAD_NAMES:
            n = kept.shape[1]
            nh = self._query_heads.get(layer, n)
            bad = [h for h in self.heads if not 0 <= h < nh]
            if bad:
                raise ValueError(f"trace heads {bad} out of range for {nh} heads in {name!r}")
            # attention may have made the kept heads alone (`LayerTrace.heads`)
            made_alone = name in _QUERY_HEAD_NAMES and n == len(self.heads) < nh
            if not made_alone:
                # grouped-query k/v: keep the key/value heads the chosen query heads read
                keep = self.heads if n == nh else sorted({h // (nh // n) for h in self.heads})
                kept, copy = kept[:, keep], False  # indexing copies
        if self.rows is not None and name in WEIGHT_NAMES:
            T = self._query_rows.get(layer, kept.shape[2])
            rows = query_rows(self.rows, T)
            if kept.shape[2] == T > len(rows):  # made whole (attention may make the rows alone)
                kept, copy = kept[:, :, rows], False
        if self.dtype is not None and kept.is_floating_point() and kept.dtype != self.dtype:
            kept, copy = narrowed(kept, self.dtype), False
        self.values[(layer, name)] = kept.clone() if copy else kept
        return value

    def get(self, name: str, layer: int | None = None) -> Tensor:
        """The value kept for `name` at `layer` (None for the model-level names: logits,
        embeddings); KeyError listing what was kept. Also `trace[name, layer]`,
        `trace[name]`."""
        try:
            return self.values[(layer, name)]
        except KeyError:
            if name in self.absent:
                raise KeyError(f"trace has no {name!r}: the traced model never computes it, "
                               f"as {self.absent[name]}") from None
            have = sorted(f"{n}@{lay}" for lay, n in self.values)
            raise KeyError(
                f"trace has no {name!r} for layer {layer}; captured: {have or 'nothing'}"
            ) from None

    def __getitem__(self, key: str | tuple[str, int | None]) -> Tensor:
        """`trace["attn_weights", 0]`, `trace["logits"]`: `get`'s (name, layer), in
        TransformerLens's cache order."""
        return self.get(key) if isinstance(key, str) else self.get(*key)

    def __contains__(self, key: object) -> bool:
        """Whether a value is kept, asked as the keys iterate ((layer, name)) or as `get`
        takes them ((name, layer), or a model-level name alone)."""
        if isinstance(key, str):
            key = (None, key)
        elif isinstance(key, tuple) and len(key) == 2 and isinstance(key[0], str):
            key = (key[1], key[0])
        return key in self.values

    def __iter__(self) -> Iterator[tuple[int | None, str]]:
        return iter(self.values)

    def __len__(self) -> int:
        return len(self.values)

    def __repr__(self) -> str:
        """What a notebook shows: the filters, then what was captured and its size."""
        filters = ", ".join(f"{k}={v}" for k, v in (
            ("layers", None if self.layers is None else sorted(self.layers)),
            ("heads", self.heads), ("rows", None if self.rows is None else list(self.rows)),
            ("names", None if self.names is None else sorted(self.names)),
        ) if v is not None)
        layers = sorted({lay for lay, _ in self.values if lay is not None})
        names = sorted({n for _, n in self.values})
        held = (f"{len(self)} values: layers {layers or '-'}, names {names}, "
                f"{self.size_text()}") if self.values else "nothing captured yet"
        return f"Trace({filters}{'; ' if filters else ''}{held})"

    def nbytes(self) -> int:
        """Bytes held by the captured tensors."""
        return sum(t.numel() * t.element_size() for t in self.values.values())

    def size_text(self) -> str:
        """`nbytes` to read: "24.6 kB", "1.2 MB"."""
        size = self.nbytes()
        return f"{size / 1e6:.1f} MB" if size >= 100_000 else f"{size / 1e3:.1f} kB"

    def clear(self) -> None:
        """Forget every kept value and what the last pass masked (the filters stay)."""
        self.values.clear()
        self.windows, self.attention_mask, self.masked = {}, None, {}

    def to_dict(self) -> dict[str, Tensor]:
        """Flat `{"name" or "layer.name": tensor}` view, e.g. for safetensors or JSON export."""
        return {(n if lay is None else f"{lay}.{n}"): t for (lay, n), t in self.values.items()}


def indices(what: str, given: int | Iterable[int], negative: bool = False, *,
            owner: str = "Trace") -> list[int]:
    """A filter's or an edit's indices (one int stands for a list of one), refused by name
    unless they are integers (>= 0 unless `negative`): a string or a float would fail, or be
    truncated, only inside the forward pass. owner: who took them, for the message."""
    one = not isinstance(given, Iterable) or getattr(given, "ndim", None) == 0  # 0-d arrays
    values: list[int] = []
    listed: list[Any] = [given] if one else list(cast(Iterable[int], given))
    for value in listed:
        try:  # numpy's and torch's integers too
            index = None if isinstance(value, bool) else operator.index(value)
        except TypeError:
            index = None
        if index is None or (index < 0 and not negative):
            last = " (the last layer is n_layer - 1)" if what == "layers" else ""
            raise ValueError(f"{owner}({what}={given!r}): {what} are integers" + (
                "" if negative else f" >= 0{last}") + f", not {value!r}")
        values.append(index)
    if not values:
        raise ValueError(f"{owner}({what}=[]) would keep nothing; pass {what}=None for all")
    return values


def narrowed(value: Tensor, dtype: torch.dtype) -> Tensor:
    """value in `dtype`, with values past its range held at +-its largest finite one: large
    float32 scores would otherwise become +-inf in float16 and read as masked. -inf (a
    masked score) stays -inf."""
    largest = torch.finfo(dtype).max
    if torch.finfo(value.dtype).max <= largest or value.numel() == 0:  # nothing to clamp
        return value.to(dtype)
    if value.device.type == "cpu":  # one read spares most values (weights) three passes;
        low, high = torch.aminmax(value)  # a GPU would wait on .item()
        if -largest <= low.item() and high.item() <= largest:
            return value.to(dtype)
    clamped = value.clamp(-largest, largest)  # value's shape
    clamped.masked_fill_(value.isneginf(), float("-inf"))
    return clamped.to(dtype)

