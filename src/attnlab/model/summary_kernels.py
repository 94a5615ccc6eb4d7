"""Per-head attention summaries on a GPU from q and k alone: no score or weight tile in memory.

`traced_attention.py` calls `layer_summaries` for a trace of summaries alone when
`available(q)` and the mask is one the kernels rebuild from indices (causal with cached
keys, a sliding window, key padding); the context then comes from the fused path, or with
`ROWS_MAKE_CONTEXT` from the rows pass itself (`attend_and_summarise`), or with
`LSE_FROM_FORWARD` from SDPA's kernel, which hands over each row's lse too
(`attend_with_lse`: the row summaries then need no running max). The
summaries mean exactly what `summaries.py` says (pad rows and rows with nothing to attend
to are 0s, the sink is the row's first real key); this module only decides the launch. The
kernels (`summary_triton.py`) need triton, which attnlab does not depend on: it is imported
here lazily, on a CUDA tensor only (or under Triton's interpreter, which the tests run on
CPU tensors). Why two passes and no tiles: docs/performance-gpu.md#summaries-on-a-gpu.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import torch
from torch import Tensor
from torch.nn.attention import SDPBackend

from . import runtime
from .summaries import SUMMARY_NAMES

#: Model dtypes the kernels take as is (float64 models keep the torch path: their
#: summaries are float64, `runtime.wide`).
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
#: (query rows, keys, warps[, pipeline stages]) per block of the rows pass and of the
#: received pass, for 16-bit head sizes up to 128 (flash attention's forward tiles), and
#: smaller ones for larger heads or float32, whose tiles would spill registers at the first.
ROWS_BLOCKS: dict[int, tuple[int, ...]] = {128: (128, 64, 8), 256: (64, 32, 8)}
RECEIVED_BLOCKS: dict[int, tuple[int, ...]] = {128: (64, 128, 8), 256: (32, 64, 8)}
#: the summaries of each query row, in the kernels' argument order
ROW_NAMES = ("attn_entropy", "attn_sink", "attn_distance", "attn_max")
#: Whether a trace of summaries alone (`traced_attention`) takes each layer's context from
#: the rows pass (`attend_and_summarise`, one flash forward with the summaries' sums) instead
#: of SDPA's forward beside the two passes: on since an H100 measured it faster
#: (docs/performance-gpu.md#summaries-on-a-gpu).
ROWS_MAKE_CONTEXT = True
#: Whether a trace of summaries alone over the plain causal mask (T == S, no padding, no
#: window) takes each layer's context and each row's lse from SDPA's own kernel
#: (`attend_with_lse`), and its row summaries from the given-lse rows pass (no running max,
#: no sum per block): off, since an H100 measured it slower than `ROWS_MAKE_CONTEXT`
#: (docs/performance-gpu.md#summaries-on-a-gpu).
LSE_FROM_FORWARD = False
#: The model dtypes whose traces of whole attention weights (no scores, no summaries, no
#: dropout) under a mask the kernels rebuild take them from `attention_weights` (one pass
#: that writes each weight once from its row's lse) instead of the explicit path's scores,
#: mask and softmax. 16-bit ones: an H100 measured the pass faster there from 1k to 8k
#: tokens, with less memory and closer to float64, and slower for float32
#: (docs/performance-gpu.md#the-weights-pass).
WEIGHTS_FROM_LSE: frozenset[torch.dtype] = frozenset({torch.bfloat16, torch.float16})
#: (query rows, keys, warps) per block of the weights pass, by model dtype width (bytes):
#: float32's the fastest of four an H100 timed (docs/performance-gpu.md#the-weights-pass)
WEIGHTS_BLOCKS: dict[int, tuple[int, ...]] = {2: (128, 64, 8), 4: (32, 64, 4)}


def available(q: Tensor) -> bool:
    """Whether the kernels can summarise attention of q (B, nh, T, hs): a CUDA tensor of a
    dtype in `DTYPES` with triton installed. The mask is the caller's to check."""
    return q.is_cuda and q.dtype in DTYPES and q.shape[-1] <= 256 and runtime.triton_importable()


def layer_summaries(names: list[str], q: Tensor, k: Tensor, scale: float, *, causal: bool,
                    window: int | None = None, padding: Tensor | None = None,
                    blocks: tuple[int, int] | None = None,
                    lse: Tensor | None = None) -> dict[str, Tensor]:
    """The summaries `names` (float32, in `SUMMARY_NAMES` order) of softmax(q k^T * scale)
    under the mask: q (B, nh, T, hs), k (B, nkv, S, hs) with nh % nkv == 0 (head h reads key
    head h // (nh // nkv)); query row r is key index S - T + r. causal: row r sees keys up to
    its own; window: only its last `window` keys (with causal); padding (B, S) bool, True for
    real tokens: pads are never attended, a pad's own row is 0s. blocks: (rows, keys) per
    block for both passes instead of the tuned sizes (the tests use small ones). lse: each
    row's natural log-sum-exp (B, nh, T) under the same mask, as the attention forward made
    it (`attend_with_lse`): the row summaries then come from the given-lse pass."""
    return _run(names, q, k, None, scale, causal, window, padding, blocks, lse, None)[0]


def attend_with_lse(q: Tensor, k: Tensor, v: Tensor, scale: float
                    ) -> tuple[Tensor, Tensor] | None:
    """Causal attention of q over k, v (B, nh, T, hs), T == S, no other mask: the context
    (B, nh, T, hs) as `F.scaled_dot_product_attention(..., is_causal=True)` computes it, and
    each row's natural log-sum-exp (B, nh, T) float32, which the public function drops. The
    kernel SDPA itself would run (`torch._fused_sdp_choice`: cuDNN's first on an H100 with a
    recent cuDNN, else flash attention for 16-bit inputs, memory-efficient attention for
    float32), called by name with its lse kept; the flash kernel on a CPU. None where SDPA
    would run its unfused math path (the caller then takes the fused path and the rows
    pass)."""
    B, nh, T, _ = q.shape
    aten = torch.ops.aten
    if not q.is_cuda:
        context, lse = aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, True, scale=scale)[:2]
        return context, lse  # (B, nh, T, hs), (B, nh, T)
    backend = sdpa_choice(q, k, v, scale)
    if backend == SDPBackend.CUDNN_ATTENTION:
        context, lse = aten._scaled_dot_product_cudnn_attention(
            q, k, v, None, True, 0.0, True, False, scale=scale)[:2]
    elif backend == SDPBackend.FLASH_ATTENTION:
        context, lse = aten._scaled_dot_product_flash_attention(
            q, k, v, 0.0, True, False, scale=scale)[:2]
    elif backend == SDPBackend.EFFICIENT_ATTENTION:
        context, lse = aten._scaled_dot_product_efficient_attention(
            q, k, v, None, True, 0.0, True, scale=scale)[:2]
    else:
        return None
    # cuDNN's lse is (B, nh, T, 1), memory-efficient attention's padded to 32 rows
    return context, lse.reshape(B, nh, -1)[..., :T]  # (B, nh, T, hs), (B, nh, T)


def attention_weights(q: Tensor, k: Tensor, v: Tensor | None, scale: float, *, causal: bool,
                      window: int | None = None, padding: Tensor | None = None,
                      lse: Tensor | None = None, blocks: tuple[int, int] | None = None
                      ) -> tuple[Tensor, Tensor | None]:
    """The whole weights softmax(q k^T * scale) under the mask, (B, nh, T, S) in q's dtype,
    with `layer_summaries`' arguments: 0s where the mask hides a key and over a row with no
    key to attend (a pad's own query). lse: each row's natural log-sum-exp (B, nh, T) as the
    attention forward made it (`attend_with_lse`); None: the rows pass makes it first, and
    with v (B, nkv, S, hs) given also the context (B, nh, T, hs), returned beside the weights
    (else None)."""
    if lse is not None and v is not None:
        raise ValueError("pass v or lse, not both: with a given lse no pass makes the context")
    weights = q.new_empty((q.shape[0], q.shape[1], q.shape[2], k.shape[2]))  # (B, nh, T, S)
    context = _run([], q, k, v, scale, causal, window, padding, blocks, lse, weights)[1]
    return weights, context


def sdpa_choice(q: Tensor, k: Tensor, v: Tensor, scale: float) -> SDPBackend:
    """The kernel `F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)`
    would run. torch hands its choice back as a plain int, which no `SDPBackend` member
    equals."""
    return SDPBackend(torch._fused_sdp_choice(q, k, v, is_causal=True, scale=scale))


def attend_and_summarise(names: list[str], q: Tensor, k: Tensor, v: Tensor, scale: float, *,
                         causal: bool, window: int | None = None,
                         padding: Tensor | None = None,
                         blocks: tuple[int, int] | None = None
                         ) -> tuple[Tensor, dict[str, Tensor]]:
    """The context (B, nh, T, hs) in v's dtype and `layer_summaries`, with the rows pass as
    the attention forward: v (B, nkv, S, hs) like k. A row with no key to attend gets a
    context of 0s, as `attention.attend`'s (a pad's own row, which has keys, keeps its)."""
    if v.shape != k.shape or v.dtype != q.dtype:
        raise ValueError(f"v {tuple(v.shape)} {v.dtype} does not fit k {tuple(k.shape)} and "
                         f"q's {q.dtype}: pass v of k's shape and q's dtype")
    values, context = _run(names, q, k, v, scale, causal, window, padding, blocks, None, None)
    assert context is not None
    return context, values


def _run(names: list[str], q: Tensor, k: Tensor, v: Tensor | None, scale: float, causal: bool,
         window: int | None, padding: Tensor | None, blocks: tuple[int, int] | None,
         lse: Tensor | None, weights: Tensor | None
         ) -> tuple[dict[str, Tensor], Tensor | None]:
    """The checked launch behind all three: the summaries, the context when v is given and
    the whole weights into `weights` when given; lse: the natural one the caller was given,
    or None (the rows pass makes it)."""
    B, nh, T, hs = q.shape
    nkv, S = k.shape[1], k.shape[2]
    unknown = sorted(set(names) - set(SUMMARY_NAMES))
    if unknown:
        raise ValueError(f"unknown summaries {unknown}; known: {list(SUMMARY_NAMES)}")
    if nh % nkv or k.shape[0] != B or k.shape[-1] != hs or S < T:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} do not fit: need q "
                         "(B, nh, T, hs), k (B, nkv, S, hs) with nh % nkv == 0 and S >= T")
    q = q if q.stride(-1) == 1 else q.contiguous()  # (B, nh, T, hs)
    k = k if k.stride(-1) == 1 else k.contiguous()  # (B, nkv, S, hs)
    device = q.device
    first = torch.zeros(B, dtype=torch.int32, device=device)  # (B,) each row's first real key
    pad = clean = first  # read only with a padding
    if padding is not None:
        if tuple(padding.shape) != (B, S):
            raise ValueError(f"padding of shape {tuple(padding.shape)}; pass the (B, S) = "
                             f"({B}, {S}) mask over every key")
        pad = padding.to(device=device, dtype=torch.uint8).contiguous()  # (B, S)
        first = pad.argmax(dim=-1).to(torch.int32)  # (B,) the first 1
        clean = _clean_from(pad, first)  # (B,)
    values = {name: torch.empty((B, nh, T), dtype=torch.float32, device=device)
              for name in names if name != "attn_received"}  # (B, nh, T) each
    windowed = window is not None and window < S
    common = dict(nh=nh, group=nh // nkv, T=T, S=S, offset=S - T,
                  window=window if windowed else 0, scale2=scale * math.log2(math.e),
                  HS=hs, BLOCK_D=max(16, 1 << (hs - 1).bit_length()), CAUSAL=causal,
                  WINDOWED=windowed, HAS_PAD=padding is not None,
                  IEEE=q.dtype == torch.float32)
    if lse is None:  # written by the rows pass
        lse2 = torch.empty((B, nh, T), dtype=torch.float32, device=device)  # (B, nh, T)
    else:
        # the weights pass weighs a pad's own row (its keys' weights), the summaries do not
        lse2 = _given_lse2(lse, padding if weights is None else None, (B, nh, T))  # (B, nh, T)
    context = None
    if v is not None:
        v = v if v.stride(-1) == 1 else v.contiguous()  # (B, nkv, S, hs)
        # laid out (B, T, nh, hs), as SDPA's: the heads' merge after it is then a view
        context = q.new_empty((B, T, nh, hs)).transpose(1, 2)  # (B, nh, T, hs)
    _launch(names, q, k, (pad, first, clean, lse2), values, common, blocks,
            (v, context, weights), given=lse is not None)
    return {name: values[name] for name in SUMMARY_NAMES if name in names}, context


def _given_lse2(lse: Tensor, padding: Tensor | None, shape: tuple[int, int, int]) -> Tensor:
    """(B, nh, T) float32 the base-2 lse the kernels read from a given natural one: +inf
    where a row has no weights (no key to attend: lse -inf; a pad's own query), as the rows
    pass writes it."""
    if tuple(lse.shape) != shape:
        raise ValueError(f"lse of shape {tuple(lse.shape)}; pass (B, nh, T) = {shape}, one "
                         "per query row")
    lse = lse.to(dtype=torch.float32)  # (B, nh, T)
    has = torch.isfinite(lse)  # (B, nh, T)
    if padding is not None:  # a pad's own query: the last T keys are the queries
        has = has & padding[:, None, padding.shape[-1] - shape[-1]:].to(lse.device)
    return torch.where(has, lse * math.log2(math.e), math.inf).contiguous()  # (B, nh, T)


def _clean_from(pad: Tensor, first: Tensor) -> Tensor:
    """(B,) int32: the key from which each row's keys are all real, where the kernels need no
    padding mask: its first real key for a left padding (real keys after it only), else S.
    Computed on the device, so a trace does not wait on it."""
    S = pad.shape[-1]
    count = pad.sum(dim=-1, dtype=torch.int32)  # (B,) real keys
    left_padded = (count == S - first) & (count > 0)  # (B,) an all-pad row keeps its masks
    return torch.where(left_padded, first, S).to(torch.int32)  # (B,)


def _launch(names: list[str], q: Tensor, k: Tensor,
            masks: tuple[Tensor, Tensor, Tensor, Tensor],
            values: dict[str, Tensor], common: dict[str, Any],
            blocks: tuple[int, int] | None,
            attention: tuple[Tensor | None, Tensor | None, Tensor | None], given: bool
            ) -> None:
    """The passes into `values`; masks: the padding (B, S), first real keys (B,), the keys
    from which no mask is needed (B,) and each row's lse (B, nh, T) (base 2) for the
    received and weights passes, which run only when wanted: given, or written by the rows
    pass; attention: v, the context the rows pass writes and the weights the weights pass
    writes, or Nones."""
    from . import summary_triton as kernels  # triton: imported only here

    B, nh, T, hs = q.shape
    S = k.shape[2]
    pad, first, clean, lse = masks
    v, context, weights = attention
    strides = (q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2))
    # without a context the rows pass reads neither: q stands in for both pointers
    v_strides = (0, 0, 0) if v is None else (v.stride(0), v.stride(1), v.stride(2))
    context_strides = ((0, 0, 0) if context is None
                       else (context.stride(0), context.stride(1), context.stride(2)))
    size = 128 if hs <= 128 and q.dtype != torch.float32 else 256
    wants = {f"WANT_{name.removeprefix('attn_').upper()}": name in names for name in ROW_NAMES}
    outs = [values.get(name, lse) for name in ROW_NAMES]  # lse: a pointer never written
    received_wanted = "attn_received" in names
    # triton launches on the current device: make it q's (a model on cuda:1, say)
    with torch.cuda.device(q.device) if q.is_cuda else contextlib.nullcontext():
        tuning = _tuning(ROWS_BLOCKS[size], blocks)
        grid = (math.ceil(T / tuning["BLOCK_M"]), B * nh)
        if given:
            if any(wants.values()):
                kernels.given_rows_kernel[grid](q, k, pad, first, clean, lse, *outs, *strides,
                                                **common, **wants, **tuning)
        else:
            kernels.rows_kernel[grid](q, k, q if v is None else v,
                                      q if context is None else context, pad, first, clean,
                                      lse, *outs, *strides, *v_strides, *context_strides,
                                      **common, **wants, **tuning, CONTEXT=context is not None,
                                      PAD_ROWS=weights is None)
        if received_wanted:
            received = torch.empty((B, nh, S), dtype=torch.float32,
                                   device=q.device)  # (B, nh, S)
            tuning = _tuning(RECEIVED_BLOCKS[size], blocks)
            kernels.received_kernel[(math.ceil(S / tuning["BLOCK_N"]), B * nh)](
                q, k, pad, first, clean, lse, received, *strides, **common, **tuning)
            values["attn_received"] = received
        if weights is not None:
            _weights_pass(q, k, masks, weights, common, blocks)


def _weights_pass(q: Tensor, k: Tensor, masks: tuple[Tensor, Tensor, Tensor, Tensor],
                  weights: Tensor, common: dict[str, Any], blocks: tuple[int, int] | None
                  ) -> None:
    """`weights_triton.weights_kernel` into weights (B, nh, T, S), from masks' lse2."""
    from . import weights_triton  # triton: imported only here

    B, nh, T, _ = q.shape
    strides = (q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2))
    tuning = _tuning(WEIGHTS_BLOCKS[4 if q.dtype == torch.float32 else 2], blocks)
    weights_triton.weights_kernel[(math.ceil(T / tuning["BLOCK_M"]), B * nh)](
        q, k, *masks, weights, *strides, **common, **tuning)


def _tuning(tuned: tuple[int, ...], blocks: tuple[int, int] | None) -> dict[str, Any]:
    """A launch's block sizes, warps and Triton's num_stages where the sizes name one (a
    fourth number); blocks: (rows, keys) with 4 warps instead of the tuned sizes."""
    block_m, block_n, warps, *stages = tuned if blocks is None else (*blocks, 4)
    return {"BLOCK_M": block_m, "BLOCK_N": block_n, "num_warps": warps,
            **({"num_stages": stages[0]} if stages else {}),
            "enable_fp_fusion": True}  # named: no warning
