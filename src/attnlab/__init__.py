"""attnlab: causal self-attention language models you can build, train, generate with,
and look inside.

The public API is re-exported here. Below it, one package per job, each importing only the
ones before it: `model` (the GPT and its parts), `tokenizers`, `viz` (figures),
`checkpoint` and `hf` (attnlab's and Hugging Face's directories), `load` (open either),
`interp` (edits, head detectors, patching, logit lens), `generate`, `train`, `viewer`
(the HTTP viewer and the notebook view), `demos` (the seed reproductions) and `cli`.
The functions `train` and `generate` are not re-exported, since their names belong to their
modules: write `from attnlab.generate import generate` and `from attnlab.train import train`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names for type checkers; at run time each loads on first use
    from .checkpoint import Checkpoint, save_checkpoint
    from .generate import GenerationConfig, generate_text, stream, stream_text
    from .hf import load_hf, load_hf_gpt2, save_hf, save_hf_gpt2
    from .interp.edits import Edit, Edits
    from .load import ModelInfo, inspect_dir, load_checkpoint
    from .model.attention import CausalSelfAttention, attend
    from .model.decode import DecodeStep, half_weights
    from .model.gpt import GPT, GPTConfig, ModelOutput, next_token_loss
    from .model.kv_cache import KVCache
    from .model.layers import RMSNorm
    from .model.masks import Mask, build_mask, causal_mask, padding_mask
    from .model.memory import DoesNotFitError
    from .model.trace import Trace
    from .tokenizers import Tokenizer, get_tokenizer, load_tokenizer
    from .train.config import TrainConfig, TrainResult
    from .train.data import load_dataset
    from .viewer.app import ServeConfig, create_app
    from .viewer.fragment import View
    from .viewer.notebook import show

__version__ = "0.1.0"

#: the names each module gives the public API. `import attnlab` loads none of them (torch
#: takes seconds to import, and `attnlab --version` or `--help` needs none); the first use of
#: a name loads its module (PEP 562 `__getattr__` below)
_FROM = {
    "checkpoint": ("Checkpoint", "save_checkpoint"),
    "generate": ("GenerationConfig", "generate_text", "stream", "stream_text"),
    "hf": ("load_hf", "load_hf_gpt2", "save_hf", "save_hf_gpt2"),
    "interp.edits": ("Edit", "Edits"),
    "load": ("ModelInfo", "inspect_dir", "load_checkpoint"),
    "model.attention": ("CausalSelfAttention", "attend"),
    "model.masks": ("Mask", "build_mask", "causal_mask", "padding_mask"),
    "model.decode": ("DecodeStep", "half_weights"),
    "model.gpt": ("GPT", "GPTConfig", "ModelOutput", "next_token_loss"),
    "model.kv_cache": ("KVCache",),
    "model.layers": ("RMSNorm",),
    "model.memory": ("DoesNotFitError",),
    "model.trace": ("Trace",),
    "tokenizers": ("Tokenizer", "get_tokenizer", "load_tokenizer"),
    "train.config": ("TrainConfig", "TrainResult"),
    "train.data": ("load_dataset",),
    "viewer.app": ("ServeConfig", "create_app"),
    "viewer.fragment": ("View",),
    "viewer.notebook": ("show",),
}
_WHERE = {name: module for module, names in _FROM.items() for name in names}

__all__ = [
    "GPT",
    "CausalSelfAttention",
    "Checkpoint",
    "DecodeStep",
    "DoesNotFitError",
    "Edit",
    "Edits",
    "GPTConfig",
    "GenerationConfig",
    "KVCache",
    "Mask",
    "ModelInfo",
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
    "inspect_dir",
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


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        if name.startswith("__"):
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        try:  # a subpackage, as `import attnlab` then `attnlab.viz` read when it was eager
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as err:
            if err.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    value = getattr(importlib.import_module(f".{where}", __name__), name)
    globals()[name] = value  # later uses skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
