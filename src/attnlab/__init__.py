"""attnlab: causal self-attention language models you can build, train, generate with,
and look inside.

The public API is re-exported here; modules below it follow DESIGN.md (one concept each).
"""

from .attention import CausalSelfAttention, Mask, attend, build_mask, causal_mask, padding_mask
from .kv_cache import KVCache
from .model import GPT, GPTConfig, ModelOutput, next_token_loss
from .server import ServeConfig, create_app
from .trace import Trace

__version__ = "0.1.0"

__all__ = [
    "GPT",
    "CausalSelfAttention",
    "GPTConfig",
    "KVCache",
    "Mask",
    "ModelOutput",
    "ServeConfig",
    "Trace",
    "__version__",
    "attend",
    "build_mask",
    "causal_mask",
    "create_app",
    "next_token_loss",
    "padding_mask",
]
