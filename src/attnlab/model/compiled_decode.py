"""`compiled_decode`: the decode step at fixed shapes, compiled once and replayed.

`DecodeStep` attends over the cache's filled prefix, one key longer every step: a new shape
each time, which a recorded graph cannot replay. This module runs the same step
(`DecodeStep.forward_with`, the same weights and wiring) over the whole static buffer
instead: the new keys and values are written at a slot held in a tensor (`index_copy_`),
and a (B, S_max) mask hides the slots not written yet and each row's left padding. Every
step then has the same shapes and reads the same addresses, so
`torch.compile(mode="reduce-overhead", fullgraph=True, dynamic=False)` compiles it with
Inductor once and, on CUDA, records it as a CUDA graph that each step replays with one
launch instead of one per kernel (gpt-fast's decode; Hugging Face's static cache). On a CPU
the same mode compiles without graphs: the code path runs and is tested anywhere.

torch.compile rather than capturing `torch.cuda.CUDAGraph` by hand: Inductor also fuses the
step's many small element-wise kernels (norms, rotary, residual adds), which a bare capture
would replay one by one; its CUDA-graph trees manage the graph's memory pool, static inputs
and re-recording when an input's address changes; and the path it takes on a CPU is the one
a GPU takes, up to the graph. The price is the first call's compile time (reported as
`CompiledDecode.compile_seconds`).

A `CompiledDecode` holds its static cache and inputs and is kept per (model, batch size,
cache length, dtype, device): a second generation of that shape reuses the compiled graph.
The cache length is the prompt + new tokens rounded up to a power of two (at most
block_size), so prompts of nearby lengths share one. Generation (`generate.stream(...,
compile=True)`) prefills with `GPT.forward` into the same buffers; edits, float16 weights and
sampling are not this module's business.
"""

from __future__ import annotations

import contextlib
import time
import types
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, cast
from weakref import WeakKeyDictionary

import torch
from torch import Tensor

from .attention import attend
from .decode import DecodeStep, decodes_by_forward
from .kv_cache import KVCache, LayerKVCache
from .masks import Mask
from .runtime import quiet_compile

if TYPE_CHECKING:
    from .gpt import GPT


def _static_step(
    step: DecodeStep, buffers: list[tuple[Tensor, Tensor]], token: Tensor,
    slot: Tensor, pads: Tensor, key_mask: Tensor,
) -> Tensor:
    """token (B, 1) written at cache slot `slot` (1,) -> next-token logits (B, V), over the
    whole static buffers (B, nkv, S_max, hs) of each layer. pads (B,): padding slots before
    each row's first token (position = slot - pads); key_mask (B, S_max): False at padding."""
    slots = torch.arange(key_mask.shape[1], device=key_mask.device)  # (S_max,)
    seen = key_mask & (slots <= slot)  # (B, S_max): written slots of real tokens
    masks: dict[int | None, Mask] = {}  # one per window size, shared by its layers

    def attention(i: int, window: int | None, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        keys, values = buffers[i]  # (B, nkv, S_max, hs) each
        keys.index_copy_(2, slot, k)
        values.index_copy_(2, slot, v)
        if window not in masks:
            may_attend = seen if window is None else seen & (slots > slot - window)
            masks[window] = Mask(may_attend[:, None, None, :])  # (B, 1, 1, S_max)
        return attend(q, keys, values, masks[window], scale=step.config.attn_scale,
                      softcap=step.config.attn_logit_softcapping,
                      wide=step.config.scores_in_float32,
                      sinks=step.layers[i].sinks)  # (B, nh, 1, hs)

    return step.forward_with(token, slot - pads, 0, attention)  # (B, V)


def _own_copy(fn: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """`fn` with a code object of its own. Dynamo keeps compilations per code object and,
    with fullgraph=True, fails once one holds `recompile_limit` (8) of them: each
    `CompiledDecode` compiles its own copy once, so a process may keep any number."""
    return cast("Callable[..., Tensor]", types.FunctionType(
        fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__))


class CompiledDecode:
    """The compiled decode step of one model at one (batch size, cache length), with the
    static cache and inputs it reads; `__call__` is `DecodeStep.__call__` for this cache.

    compile_seconds: the first call's wall time (compiling and one step), None before it.
    cuda_graph: whether that compilation recorded a CUDA graph (False on a CPU, or where
    Inductor skipped graphs, which it logs with the reason); None before it.
    Keep the object (`compiled_decode` does) to reuse the compiled graph.
    """

    def __init__(self, model: GPT, batch_size: int, max_len: int) -> None:
        from torch._dynamo import mark_static_address  # lazily: it takes a while to import

        self.cache: KVCache = model.new_cache(batch_size, max_len)
        device = model.wte.weight.device
        self.key_mask = torch.ones(batch_size, max_len, dtype=torch.bool,
                                   device=device)  # (B, S_max) False at padding slots
        self.pads = torch.zeros(batch_size, dtype=torch.long, device=device)  # (B,)
        self.slot = torch.zeros(1, dtype=torch.long, device=device)  # (1,) next write
        self.token = torch.zeros(batch_size, 1, dtype=torch.long, device=device)  # (B, 1)
        layers = [layer for layer in self.cache.layers if isinstance(layer, LayerKVCache)]
        self.buffers = [(layer.k, layer.v) for layer in layers]
        for t in (self.key_mask, self.pads, self.slot, self.token,
                  *(t for kv in self.buffers for t in kv)):
            mark_static_address(t)  # the same address every step: no copy into the graph
        self.compiled = torch.compile(_own_copy(_static_step), mode="reduce-overhead",
                                      fullgraph=True, dynamic=False)
        self.compile_seconds: float | None = None
        self.cuda_graph: bool | None = None
        self.in_use = False  # serving a generation (`generate` sets it while it runs)
        self._marked: DecodeStep | None = None  # the step whose weights are marked static

    @property
    def batch_size(self) -> int:
        return self.key_mask.shape[0]

    @property
    def max_len(self) -> int:
        return self.key_mask.shape[1]

    def start(self, attention_mask: Tensor | None) -> None:
        """After a prefill filled cache slots 0..seq_len-1: attention_mask (B, seq_len) 1/0
        over them (None: no padding); every later slot holds a real (generated) token."""
        filled = self.cache.seq_len
        self.key_mask.fill_(True)
        if attention_mask is None:
            self.pads.zero_()
            return
        if attention_mask.shape != (self.batch_size, filled):
            raise ValueError(f"attention_mask of shape {tuple(attention_mask.shape)} does not "
                             f"cover the {filled} filled slots of {self.batch_size} rows")
        self.key_mask[:, :filled] = attention_mask.bool()
        self.pads.copy_(filled - attention_mask.long().sum(-1))  # left padding: all first

    @torch.inference_mode()
    def __call__(self, step: DecodeStep, token: Tensor) -> Tensor:
        """token (B, 1) -> next-token logits (B, V); writes its keys/values at cache.seq_len.

        `step` is the model's `DecodeStep` (`decode.decode_step`), whose weights it reads.
        """
        pos = self.cache.seq_len
        if pos >= self.max_len:
            raise ValueError(f"the static cache holds {self.max_len} slots and all are "
                             "filled; prefill a new window first")
        if token.shape != self.token.shape:
            raise ValueError(f"token ids of shape {tuple(token.shape)}; this compiled step "
                             f"takes {tuple(self.token.shape)}")
        if step is not self._marked:
            from torch._dynamo import mark_static_address

            for t in step.tensors():
                mark_static_address(t)
            self._marked = step
        self.token.copy_(token)
        self.slot.fill_(pos)
        torch.compiler.cudagraph_mark_step_begin()  # the last step's outputs are done with
        first = self.compile_seconds is None
        skips = _cudagraph_skips()
        began = time.perf_counter()
        with quiet_compile() if first else contextlib.nullcontext():
            logits = self.compiled(step, self.buffers, self.token, self.slot, self.pads,
                                   self.key_mask)  # (B, V)
        if first:
            self.compile_seconds = time.perf_counter() - began
            self.cuda_graph = self.token.is_cuda and _cudagraph_skips() == skips
        self.cache.seq_len = pos + 1
        return logits.clone()  # a CUDA graph's output is overwritten by its next replay


def _cudagraph_skips() -> int:
    """How many compilations Inductor has left without CUDA graphs in this process."""
    from torch._dynamo.utils import counters

    return int(counters["inductor"]["cudagraph_skips"])


def cache_length(needed: int, block_size: int) -> int:
    """The static cache length for `needed` slots: the next power of two, at most
    block_size (fewer lengths, fewer compilations; the extra slots are masked)."""
    return min(1 << max(needed - 1, 0).bit_length(), block_size)


# model -> (batch size, cache length, dtype, device) -> its compiled step
_COMPILED: WeakKeyDictionary[GPT, dict[tuple[object, ...], CompiledDecode]] = \
    WeakKeyDictionary()


def check_compilable(model: GPT) -> None:
    """Raise unless `model`'s decode step can be compiled: float32 decode weights (the
    model's own tensors, in whatever dtype the model is), no mixture of experts and no
    latent attention."""
    if model.config.n_experts is not None:
        raise ValueError(
            f"a mixture of experts (n_experts={model.config.n_experts}) runs each expert on "
            "the rows its router sends it, a shape each step, which a compiled fixed-shape "
            "step cannot replay; generate without compile"
        )
    if decodes_by_forward(model):
        raise ValueError(f"latent attention (kv_latent={model.config.kv_latent}) or attention "
                         "matrices kept FP8 decode through the model's forward, which is not "
                         "compiled; generate without compile")
    if model.decode_weights != "float32":
        raise ValueError(
            f"a compiled decode step reads the model's own weights; this model decodes "
            f"{model.decode_weights} packed copies (half_weights, a CPU path): set "
            "model.decode_weights = 'float32' or generate without compile"
        )


def compiled_decode(model: GPT, batch_size: int, needed: int) -> CompiledDecode | None:
    """The `CompiledDecode` for `batch_size` rows and `needed` cache slots (prompt + new
    tokens, at most block_size), kept with the model: the same shape next time reuses it
    and its compiled graph. Its cache is fresh (seq_len 0). None, with a warning, while it
    is `in_use` by a generation still running (two live streams of one shape): one static
    cache cannot hold both, so the caller decodes eagerly, with the same ids."""
    check_compilable(model)
    weight = model.lm_head.weight
    max_len = cache_length(needed, model.config.block_size)
    key = (batch_size, max_len, weight.dtype, weight.device)
    held = _COMPILED.setdefault(model, {})
    if key not in held:
        held[key] = CompiledDecode(model, batch_size, max_len)
    compiled = held[key]
    if compiled.in_use:
        warnings.warn(f"the compiled decode step for {batch_size} row(s) and {max_len} "
                      "cache slots serves a generation still running; this one decodes "
                      "without it (the same ids, uncompiled speed): finish or close the "
                      "other stream first", stacklevel=3)
        return None
    compiled.cache.seq_len = 0
    return compiled


def compiled_decodes(model: GPT) -> list[CompiledDecode]:
    """The compiled steps kept with `model` (to read their compile_seconds)."""
    return list(_COMPILED.get(model, {}).values())


def release_compiled(model: GPT) -> None:
    """Drop the compiled steps kept with `model` and their static caches."""
    _COMPILED.pop(model, None)
