"""The model: everything `GPT.forward` runs.

`config.py` (`GPTConfig`, presets), `layers.py` (norms, MLPs, the CPU `Linear`), `rope.py`
(rotary embeddings and their scalings), `attention.py` (masks, `attend`,
`CausalSelfAttention`: all attention math, with `sdpa.py`, its fused path,
`traced_attention.py`, its traced path in blocks of queries, and `summaries.py`, per-head
summaries reduced from those blocks; on a GPU `summary_kernels.py` runs them as the Triton
kernels of `summary_triton.py` and `weights_triton.py`, and `tf32x3.py` / `tf32x3_triton.py`
run float32 products on tensor cores), `kv_cache.py`, `gpt.py` (the GPT), `decode.py` (the
one-token decode step without modules), `compiled_decode.py` (that step at fixed shapes,
compiled: CUDA graphs on a GPU), `names.py` (the names a trace holds and an edit replaces),
`trace.py` (the recording seam: what a forward pass can capture and where edits apply),
`runtime.py` (which device a name means, CPU kernel and memory choices), and the loaders'
parts: `tensorfile.py` (safetensors read without trusting them), `materialize.py` (a GPT
built from named tensors) and `memory.py` (will it fit).
"""

from .attention import CausalSelfAttention, attend
from .config import PRESETS, GPTConfig
from .decode import DecodeStep, half_weights
from .gpt import GPT, ModelOutput, count_params, next_token_loss
from .kv_cache import KVCache
from .layers import RMSNorm
from .masks import Mask, build_mask, causal_mask, padding_mask
from .memory import DoesNotFitError
from .trace import Trace

__all__ = [
    "GPT",
    "PRESETS",
    "CausalSelfAttention",
    "DecodeStep",
    "DoesNotFitError",
    "GPTConfig",
    "KVCache",
    "Mask",
    "ModelOutput",
    "RMSNorm",
    "Trace",
    "attend",
    "build_mask",
    "causal_mask",
    "count_params",
    "half_weights",
    "next_token_loss",
    "padding_mask",
]
