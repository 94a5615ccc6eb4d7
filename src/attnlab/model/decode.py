"""`DecodeStep`: `GPT.forward` for one new token per row over a KV cache, without modules.

At T = 1 a small GPT does little arithmetic and much Python: module calls, and three q/k/v
projections where one would do. This module owns that fast path: it reads a `GPT`'s weights
once into plain tensors (`_DecodeLayer`) and runs `Block`'s wiring with tensor calls,
honouring every `GPTConfig` switch (norms, MLP kind, RoPE at each row's real position,
QK-norm, biases, parallel residual, sliding window, head_dim, soft caps). The model, masks
and rotary math stay in `gpt.py`, `attention.py` and `rope.py`; it is tested equal to
`GPT.forward` (tests/model/test_gpt.py).

`half_weights(model)` has decode stream every matrix as float16 (fbgemm's kernel on x86
CPUs: float16 weights, float32 arithmetic), after rounding the model's own matrices to the
same values, so forward, traces and decode still compute one model.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, NamedTuple, cast
from weakref import WeakKeyDictionary

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .attention import CausalSelfAttention, attend
from .decode_parts import (
    FLOAT16_MAX,
    Affine,
    Matrix,
    Packed16,
    StepNorm,
    in_memory_order,
    largest_magnitude,
    pack,
    step_norm,
)
from .gpt import require_eval
from .kv_cache import ConcatLayerKVCache, KVCache, LayerKVCache
from .layers import (
    GELUS,
    MLP,
    activation,
    branch_scaled,
    embedding_scale,
    glu,
    rms_norm,
    soft_cap,
)
from .masks import Mask, build_mask
from .moe import MoE
from .packed import PackedLinear
from .rope import apply_rotary, layer_ropes, nope_temperatures, real_positions
from .runtime import check_float16_weights

if TYPE_CHECKING:
    from .block import Block
    from .gpt import GPT

# one layer's attention in a decode step: (layer index, its sliding window, q (B, nh, 1, hs),
# new k and v (B, nkv, 1, hs)) -> context (B, nh, 1, hs); `DecodeStep.forward_with`
LayerAttention = Callable[[int, "int | None", Tensor, Tensor, Tensor], Tensor]


class _DecodeLayer(NamedTuple):
    """One block's weights for `DecodeStep`; None where the config leaves a part out."""

    ln_1: StepNorm | None
    qkv: Matrix  # query, key, value side by side: weight (C, nh*hs + 2*nkv*hs)
    q_norm: StepNorm | None  # QK-norm, over hs
    k_norm: StepNorm | None
    out_proj: Matrix | None
    ln_2: StepNorm | None
    fc: Matrix | None  # up projection
    gate: Matrix | None  # SwiGLU's gate projection
    proj: Matrix | None  # down projection
    window: int | None  # this layer's sliding window
    attn_post: StepNorm | None = None  # sandwich norms (Gemma 2 / 3) on each branch's output
    mlp_post: StepNorm | None = None
    moe: MoE | None = None  # a mixture of experts' router (fc, gate, proj None)
    experts: tuple[tuple[Matrix, Matrix | None, Matrix], ...] = ()  # its (fc, gate, proj)
    sinks: Tensor | None = None  # (nh,) the attention's sink logits (gpt-oss)
    l2_eps: float | None = None  # Llama 4's QK-norm after RoPE, without a weight

    @classmethod
    def of(cls, block: Block, window: int | None) -> _DecodeLayer:
        attn = cast(CausalSelfAttention, block.attn)  # never latent: DecodeStep refuses it
        moe = block.mlp if isinstance(block.mlp, MoE) else None
        mlp = None if moe is not None else cast(MLP | None, block.mlp)
        fc, gate, proj = (None, None, None) if mlp is None else _matrices(mlp)
        return cls(
            step_norm(block.ln_1),
            Affine.stack(attn.query, attn.key, attn.value),
            step_norm(attn.q_norm),
            step_norm(attn.k_norm),
            None if attn.out_proj is None else Affine.stack(attn.out_proj),
            step_norm(block.ln_2),
            fc, gate, proj,
            window, step_norm(block.ln_attn_post), step_norm(block.ln_mlp_post), moe,
            () if moe is None else tuple(_matrices(cast(MLP, e)) for e in moe.experts),
            None if attn.sinks is None else attn.sinks.detach(), attn.l2_eps,
        )

    @property
    def has_mlp(self) -> bool:
        return self.fc is not None or self.moe is not None

    def packed16(self) -> _DecodeLayer:
        """The same layer with every matrix as `Packed16`."""
        return self._replace(
            qkv=Packed16.of(cast(Affine, self.qkv)), out_proj=pack(self.out_proj),
            fc=pack(self.fc), gate=pack(self.gate), proj=pack(self.proj),
            experts=tuple((cast(Matrix, pack(fc)), pack(gate), cast(Matrix, pack(proj)))
                          for fc, gate, proj in self.experts),
        )


def _matrices(mlp: MLP) -> tuple[Matrix, Matrix | None, Matrix]:
    """An MLP's (fc, gate or None, proj) for the decode step, in place (a packed layer as
    it is: it dequantizes its weight for each product)."""
    def matrix(linear: nn.Module) -> Matrix:
        return (linear if isinstance(linear, PackedLinear)
                else Affine.stack(cast(nn.Linear, linear)))

    return matrix(mlp.fc), None if mlp.gate is None else matrix(mlp.gate), matrix(mlp.proj)


def _apply(norm: StepNorm | None, x: Tensor) -> Tensor:
    return x if norm is None else norm(x)


class DecodeStep:
    """`GPT.forward` for one new token per row over a KV cache, with the weights laid out for it.

    It stacks q, k and v into one matrix per layer (a copy, made once), uses the other
    weights in place (GPT lays them out for `x @ W`: `GPT.lay_out_weights`), and runs
    `Block`'s wiring with plain tensor calls and `attention.attend`. Build it after the
    weights are final, for eval.

    At two or more torch threads a float32 CPU matrix is multiplied in one block per thread
    (`torch.bmm` over views of its memory; `Affine`): MKL's product of one row by a matrix
    runs on one thread whatever the thread count, so one block per thread streams the
    weights faster (docs/performance.md#decode-blocks).

    weights="float16" packs every matrix (the stacked q/k/v, output, MLP and head) as float16
    for fbgemm's kernel, which sums in float32 (x86 CPUs, float32 models; packing takes
    seconds for GPT-2 small: docs/performance.md#float16-weights): the step then equals
    `GPT.forward` of the model with those matrices rounded to float16, which is what
    `half_weights` makes the model itself.
    """

    def __init__(self, model: GPT, weights: str = "float32",
                 progress: Callable[[int, int], None] | None = None) -> None:
        """progress: called as (matrices packed, in all) while float16 ones pack, a
        layer's stacked q/k/v counted as the 3 Linear layers it joins."""
        require_eval(model, "a decode step")
        if decodes_by_forward(model):
            raise ValueError("a decode step stacks q/k/v attention's matrices; this model has "
                             f"latent attention (kv_latent={model.config.kv_latent}) or "
                             "attention matrices kept FP8: decode it through its forward with "
                             "a KV cache, as generate does")
        if weights not in ("float32", "float16"):
            raise ValueError(f"weights={weights!r}: pick 'float32' or 'float16'")
        if weights == "float16":
            check_float16_weights(model)
        c = self.config = model.config
        approximate = GELUS[c.gelu]
        self.up_act, self.gate_act = (activation(name, approximate)
                                      for name in c.mlp_activations)
        self.layers = [
            _DecodeLayer.of(cast("Block", block), c.window_of(i))
            for i, block in enumerate(model.blocks)
        ]
        # each layer's q, k, v Linear layers, whose weights `layers[i].qkv` copies
        self._qkv_sources = [(a.query, a.key, a.value) for a in (
            cast(CausalSelfAttention, b.attn) for b in cast("list[Block]", list(model.blocks)))]
        self.ln_f, self.ln_emb = step_norm(model.ln_f), step_norm(model.ln_emb)
        self.wte = model.wte.weight.detach()
        self.embed_scale = embedding_scale(c.n_embd, self.wte) if c.scale_embeddings else None
        self.wpe = None if model.wpe is None else model.wpe.weight.detach()
        self.rotary, self.local_rotary = model.rotary, model.local_rotary
        self.lm_head: Matrix = Affine.stack(model.lm_head)  # weight (C, V)
        self.weights = weights
        if weights == "float16":
            # packing runs outside the GIL: a thread per torch thread, up to 8
            # (docs/performance.md#float16-weights)
            sizes = [sum(isinstance(m, nn.Linear) for m in block.modules())
                     for block in model.blocks]
            total = sum(sizes) + 1  # and the head
            with ThreadPoolExecutor(min(torch.get_num_threads(), 8)) as pool:
                head = pool.submit(Packed16.of, self.lm_head)  # the largest first
                packed = []
                for layer in pool.map(_DecodeLayer.packed16, self.layers):  # in layer order
                    packed.append(layer)
                    if progress is not None:
                        progress(sum(sizes[:len(packed)]), total)
                self.layers = packed
                self.lm_head = head.result()
            if progress is not None:
                progress(total, total)

    def refresh(self) -> None:
        """Copy the model's q/k/v weights into the stacked matrices again (float32 steps;
        float16 ones are packed copies of every matrix: build a new step). The step reads
        every other weight in place, so it then computes the model as it is now, whatever
        changed in place since, even through `.data` (which no version counter sees)."""
        if self.weights != "float32":
            raise ValueError("a float16 step holds packed copies; build a new DecodeStep")
        for layer, linears in zip(self.layers, self._qkv_sources, strict=True):
            Affine.stack(*linears, into=cast(Affine, layer.qkv))

    def _mlp(self, layer: _DecodeLayer, h: Tensor) -> Tensor:
        """h (B, C) -> the MLP's output (B, C); the layer must have one."""
        if layer.moe is not None:
            weights = layer.moe.weights(h[:, None])[:, 0]  # (B, E)
            out = layer.moe.combine(h, weights, lambda e, rows: self._dense(
                *layer.experts[e], rows))  # (B, C)
            return layer.moe.plus_shared(out, h)  # (B, C)
        return self._dense(cast(Matrix, layer.fc), layer.gate, cast(Matrix, layer.proj), h)

    def _dense(self, fc: Matrix, gate: Matrix | None, proj: Matrix, h: Tensor) -> Tensor:
        """h (B, C) through one MLP's matrices -> (B, C)."""
        if gate is None:
            return proj(self.up_act(fc(h)))  # (B, d_ff) -> (B, C)
        return proj(glu(gate(h), fc(h), self.gate_act, self.config.swiglu_clamp))  # (B, C)

    @torch.inference_mode()
    def __call__(self, token: Tensor, attention_mask: Tensor | None, cache: KVCache) -> Tensor:
        """token (B, 1) -> next-token logits (B, V); writes its keys/values at cache.seq_len.

        attention_mask (B, S): 1/0 over cached + new positions; None when nothing is padded
        or the cache keeps the mask (`KVCache.key_mask`). Token ids are not range-checked
        (generation feeds back ids it sampled); check ids from elsewhere with `GPT.forward`
        first.
        """
        c, pos = self.config, cache.seq_len
        if cache.holds_latents:
            raise ValueError("a latent-attention cache for a decode step, which has no latent "
                             "attention: make the cache with this step's model.new_cache(...)")
        if token.dim() != 2 or token.shape[1] != 1:
            raise ValueError(f"a decode step takes (B, 1) token ids, got {tuple(token.shape)}")
        layers = cast("list[LayerKVCache | ConcatLayerKVCache]", cache.layers)
        if pos >= c.block_size:
            raise ValueError(
                f"cache holds {pos} positions, so a new token would be position {pos} >= "
                f"block_size={c.block_size}; start a new cache (or use a sliding window)"
            )
        positions: Tensor | None = None  # (B,) real positions of padded rows
        attention_mask = cache.key_mask(attention_mask, 1)  # (B, pos + 1) or None
        if attention_mask is not None:
            positions = real_positions(attention_mask, 1)[:, 0]  # (B,)
        masks: dict[int | None, Mask] = {}  # one per window size, shared by its layers

        def attention(i: int, window: int | None, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
            if window not in masks:
                masks[window] = build_mask(
                    1, pos + 1, attention_mask, device=token.device, window=window
                )
            k, v = layers[i].update(pos, k, v)  # (B, nkv, pos + 1, hs) each
            return attend(q, k, v, masks[window], scale=c.attn_scale,
                          softcap=c.attn_logit_softcapping, wide=c.scores_in_float32,
                          sinks=self.layers[i].sinks)  # (B, nh, 1, hs)

        logits = self.forward_with(token, positions, pos, attention)  # (B, V)
        cache.seq_len = pos + 1
        return logits

    def forward_with(
        self, token: Tensor, positions: Tensor | None, pos: int, attention: LayerAttention
    ) -> Tensor:
        """token (B, 1) at `positions` (B,) (None: every row at `pos`) -> logits (B, V).

        Each layer's attention is `attention(layer, window, q, k, v)`: q (B, nh, 1, hs) and
        the new k, v (B, nkv, 1, hs) -> context (B, nh, 1, hs); it owns the cache and the mask
        (`__call__`: the growing prefix; `compiled_decode`: the whole static buffer).
        """
        c = self.config
        x = F.embedding(token[:, 0], self.wte)  # (B, C)
        if self.embed_scale is not None:
            x = x * self.embed_scale  # (B, C)
        if c.embedding_multiplier != 1.0:  # Granite
            x = x * c.embedding_multiplier  # (B, C)
        if self.wpe is not None:
            # (C,): every row is at position pos, or (B, C) at its own
            x = x + (self.wpe[pos] if positions is None else F.embedding(positions, self.wpe))
        x = _apply(self.ln_emb, x)  # (B, C): nanochat's embedding norm, where it has one
        at = torch.full((1, 1), pos, device=token.device) if positions is None else (
            positions[:, None])  # (B or 1, 1)
        ropes = layer_ropes(self.rotary, self.local_rotary, at)  # (B|1, 1, 1, rd) each
        temperature = nope_temperatures(at, c.nope_temperature, c.nope_temperature_floor
                                        ) if c.nope_temperature else None  # (B|1, 1, 1, 1)
        B, nh, nkv, hs = token.shape[0], c.n_head, c.n_kv_heads, c.head_size
        scale = c.residual_multiplier  # of each branch's output (Granite's)
        for i, layer in enumerate(self.layers):
            h = _apply(layer.ln_1, x)  # (B, C)
            qkv = layer.qkv(h)  # (B, (nh + 2*nkv) * hs)
            if c.qkv_clip is not None:  # OLMo 1's clamp, the same on the stacked output
                qkv = qkv.clamp_(-c.qkv_clip, c.qkv_clip)  # (B, (nh + 2*nkv) * hs)
            # one position per row: (B, heads * hs) is (B, heads, 1, hs) as it lies in memory
            q, k, v = qkv.view(B, nh + 2 * nkv, 1, hs).split_with_sizes((nh, nkv, nkv), dim=1)
            q_norm, k_norm = layer.q_norm, layer.k_norm
            if q_norm is not None and k_norm is not None and not c.qk_norm_after_rope:
                q, k = q_norm(q), k_norm(k)  # per head, or (OLMo 2) whole
            rope = ropes[layer.window is not None] if c.rotates(i) else None
            if rope is not None:
                how = c.rope_in_float32, c.rope_interleaved, c.rope_tables_rounded
                q, k = apply_rotary(q, *rope, *how), apply_rotary(k, *rope, *how)
            if q_norm is not None and k_norm is not None and c.qk_norm_after_rope:
                q, k = q_norm(q), k_norm(k)  # Hunyuan's order: after RoPE
            if layer.l2_eps is not None:
                q, k = rms_norm(q, None, layer.l2_eps), rms_norm(k, None, layer.l2_eps)
            if temperature is not None and rope is None:
                q = (q * temperature).to(q.dtype)  # (B, nh, 1, hs)
            a = attention(i, layer.window, q, k, v)  # (B, nh, 1, hs)
            a = a.view(B, nh * hs)  # (B, nh * hs)
            if layer.out_proj is not None:
                a = layer.out_proj(a)  # (B, C)
            if c.parallel_residual:  # the MLP reads ln_1's output where shared_norm
                m = 0.0 if not layer.has_mlp else branch_scaled(self._mlp(
                    layer, h if c.shared_norm else _apply(layer.ln_2, x)), scale)
                a = branch_scaled(a, scale)
                x = m + a + x if c.residual else m + a  # GPT-NeoX's order of the sum
                continue
            a = branch_scaled(_apply(layer.attn_post, a), scale)  # (B, C)
            x = x + a if c.residual else a
            if layer.has_mlp:
                m = _apply(layer.mlp_post, self._mlp(layer, _apply(layer.ln_2, x)))  # (B, C)
                m = branch_scaled(m, scale)  # (B, C)
                x = x + m if c.residual else m
        logits = self.lm_head(c.head_input(_apply(self.ln_f, x)))  # (B, V)
        logits = c.scaled_logits(logits, inplace=True)  # (B, V): Granite's, Cohere's
        return soft_cap(logits, c.final_logit_softcapping, inplace=True)  # (B, V)

    def tensors(self) -> list[Tensor]:
        """Every tensor the step reads its weights from (`compiled_decode` marks them as
        fixed addresses for CUDA graphs)."""
        found = [self.wte, *([] if self.wpe is None else [self.wpe])]
        for part in (*self.layers, self.lm_head, self.ln_f, self.ln_emb):
            found += _tensors_in(part)
        return found


def _tensors_in(part: object) -> list[Tensor]:
    """The tensors held by a tuple of weights (`_DecodeLayer`, `Affine`, `StepNorm`), nested."""
    if isinstance(part, Tensor):
        return [part]
    if isinstance(part, tuple):
        return [t for item in part for t in _tensors_in(item)]
    return []


def half_weights(model: GPT, progress: Callable[[int, int], None] | None = None) -> GPT:
    """Round every matrix of `model` to float16 values, in place, and have generation stream
    them as float16: 2 bytes per weight instead of 4 in each decode step. Returns `model`.

    The matrices are the nn.Linear weights (q, k, v, output, MLP, head; with tied weights
    the head is the token table, so lookups read the rounded values too); biases, norms and
    an untied token table stay float32, and all arithmetic stays float32. Forward passes,
    traces and the prompt then compute with exactly the values decode streams (a weight moves
    by at most 2**-11 of itself; below 2**-14, float16's subnormals, by at most 2**-25).
    Packing the weights for the kernel happens here, once (seconds for GPT-2 small:
    docs/performance.md#float16-weights); `generate`, `stream` and the server reuse it
    while the weights are unchanged and pack again after they change; a matrix changed
    after this call is no longer float16 values, so call it again to have forward passes
    compute what decode streams. x86 CPUs, float32 models on the CPU
    (`check_float16_weights`).

    progress: called as (done, in all) over every matrix rounded, then every one packed
    (a minute for a 1B model on 2 cores: the CLI shows it).
    """
    check_float16_weights(model)
    linears = [(name, m) for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    with torch.no_grad():
        # every matrix checked before any is rounded: a refusal leaves the model as it was
        for name, module in linears:
            largest = largest_magnitude(module.weight)
            if largest > FLOAT16_MAX:
                raise ValueError(
                    f"{name}.weight holds |w| = {largest:.6g}, beyond float16's largest "
                    f"value {FLOAT16_MAX:g}; keep float32 weights for this model"
                )
        for i, (_, module) in enumerate(linears):
            memory = in_memory_order(module.weight)
            memory.copy_(memory.half())  # in place: layout and ties kept
            if progress is not None:
                progress(i + 1, 2 * len(linears))
    model.decode_weights = "float16"
    if not (model.training and model.config.dropout > 0) and not decodes_by_forward(model):
        # pack now rather than in the first generation
        n = len(linears)
        decode_step(model, None if progress is None else
                    lambda done, total: progress(n + done, n + total))
    return model


def decodes_by_forward(model: GPT) -> bool:
    """Whether `model` has attention `DecodeStep` does not run: latent attention (DeepSeek's),
    or projections kept FP8 (`fp8.Fp8Linear`, which it cannot stack into one matrix)."""
    return model.config.kv_latent is not None or any(
        isinstance(m, PackedLinear) for b in cast("list[Block]", list(model.blocks))
        for m in b.attn.modules())


# model -> (its weights' identity and versions when the step was built, the step)
_STEPS: WeakKeyDictionary[GPT, tuple[tuple[object, ...], DecodeStep]] = WeakKeyDictionary()


@torch.inference_mode()
def decode_step(model: GPT, progress: Callable[[int, int], None] | None = None
                ) -> DecodeStep:
    """The `DecodeStep` a generation runs, kept with the model while every parameter is the
    same tensor at the same version and `model.decode_weights` is unchanged, else built again.

    float32: building copies q/k/v into one matrix per layer (GPT-2 small: 85 MB, kept as
    long as the model), which costs far more made afresh for each generation (freed memory
    goes back to the OS, so each copy page-faults again) than a kept step's copy into its
    own matrices (`DecodeStep.refresh`; docs/performance.md#decode-step-reuse), which sees
    every in-place change. float16 (a
    model of `half_weights`): the packed step (packing costs seconds), packed again after
    a tracked change; an edit through `.data` goes unseen, so call `half_weights` again.
    progress: `DecodeStep`'s, where a step is built.
    """
    key = (model.decode_weights, *((p.data_ptr(), p._version) for p in model.parameters()))
    held = _STEPS.get(model)
    if held is not None and held[0] == key:
        if model.decode_weights == "float32":
            held[1].refresh()
        return held[1]
    try:
        step = DecodeStep(model, model.decode_weights, progress)
    except ValueError as err:
        if model.decode_weights == "float32":
            raise
        # moved to a GPU or cast since half_weights
        raise ValueError(f"{err} (this model went through half_weights: set "
                         "model.decode_weights = 'float32' to decode it as it is)") from None
    _STEPS[model] = key, step
    return step
