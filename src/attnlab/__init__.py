"""attnlab: causal self-attention language models you can build, train, generate with,
and look inside.

The public API is re-exported here; each module below it holds one concept (attention,
model, kv_cache, generate, train, trace, intervene, ...). The functions `train` and
`generate` are not re-exported, since their names belong to their modules: write
`from attnlab.generate import generate` and `from attnlab.train import train`.
"""

from .attention import CausalSelfAttention, Mask, attend, build_mask, causal_mask, padding_mask
from .checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from .data import load_dataset
from .decode import DecodeStep, half_weights
from .generate import GenerationConfig, generate_text, stream, stream_text
from .hf import load_hf, load_hf_gpt2, save_hf, save_hf_gpt2
from .intervene import Edit, Edits
from .kv_cache import KVCache
from .layers import RMSNorm
from .model import GPT, GPTConfig, ModelOutput, next_token_loss
from .server import ServeConfig, create_app
from .show import View, show
from .tokenizers import Tokenizer, get_tokenizer, load_tokenizer
from .trace import Trace
from .train import TrainConfig, TrainResult

__version__ = "0.1.0"

__all__ = [
    "GPT",
    "CausalSelfAttention",
    "Checkpoint",
    "DecodeStep",
    "Edit",
    "Edits",
    "GPTConfig",
    "GenerationConfig",
    "KVCache",
    "Mask",
    "ModelOutput",
    "RMSNorm",
    "ServeConfig",
    "Tokenizer",
    "Trace",
    "TrainConfig",
    "TrainResult",
    "View",
    "__version__",
    "attend",
    "build_mask",
    "causal_mask",
    "create_app",
    "generate_text",
    "get_tokenizer",
    "half_weights",
    "load_checkpoint",
    "load_dataset",
    "load_hf",
    "load_hf_gpt2",
    "load_tokenizer",
    "next_token_loss",
    "padding_mask",
    "save_checkpoint",
    "save_hf",
    "save_hf_gpt2",
    "show",
    "stream",
    "stream_text",
]
