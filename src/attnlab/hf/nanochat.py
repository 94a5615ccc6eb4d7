"""NanoChatForCausalLM (Karpathy's nanochat, as transformers holds its released d32): Llama's
blocks with

- RMSNorm without a learned scale everywhere (`norm="unit_rmsnorm"`), and one more on the
  embeddings before the first block (`embedding_norm`);
- RoPE turned the other way (`rope_backwards`: its rotate_half is (x2, -x1)), then each
  head's q and k divided by their root mean square (`qk_l2_norm`);
- an ungated relu^2 MLP (`fc1`, `fc2`), no biases by default, an untied head, and the logits
  soft-capped at `final_logit_softcapping` (15).
"""

from __future__ import annotations

from typing import Any

from ..model.gpt import GPTConfig
from .fields import Fields
from .llama import LLAMA_WEIGHTS, llama_like_config, llama_like_to_hf
from .registry import Family, WeightMap

# the norms hold no tensors; the MLP's two matrices are fc1 and fc2
WEIGHTS = WeightMap(
    top=LLAMA_WEIGHTS.top, layer=LLAMA_WEIGHTS.layer, base=LLAMA_WEIGHTS.base,
    block={**{k: v for k, v in LLAMA_WEIGHTS.block.items() if k.startswith("attn.") and
              "norm" not in k}, "mlp.fc": "mlp.fc1", "mlp.proj": "mlp.fc2"})
# NanoChatConfig's defaults where they differ from those llama_like_config assumes
DEFAULTS = {"vocab_size": 50304, "hidden_size": 768, "intermediate_size": 8192,
            "num_hidden_layers": 12, "num_attention_heads": 6}


def _config(f: Fields) -> dict[str, Any]:
    f.setdefaults(DEFAULTS)
    f.one_of("hidden_act", ["relu2"], "relu2")
    cap = f.nullable("final_logit_softcapping", 15.0)  # null: no cap
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int | float)
                            or not 0 < cap < 1e30):
        raise f.refuse("final_logit_softcapping", cap, "expected a positive number or null")
    bias = f.flag("attention_bias", False)
    return llama_like_config(
        f, max_positions=2048, mlp="relu2", norm="unit_rmsnorm", bias=False, qkv_bias=bias,
        out_bias=bias, rope_backwards=True, qk_l2_norm=True, embedding_norm=True,
        final_logit_softcapping=None if cap is None else float(cap))


def _to_hf(c: GPTConfig) -> dict[str, Any]:
    hf = llama_like_to_hf(c, NANOCHAT, attention_bias=c.qkv_biased,
                          final_logit_softcapping=c.final_logit_softcapping)
    return {**hf, "hidden_act": "relu2"}


NANOCHAT = Family(
    name="nanochat", model_type="nanochat", architecture="NanoChatForCausalLM",
    base_architecture="NanoChatModel", config_from_hf=_config, config_to_hf=_to_hf,
    weights=WEIGHTS,
)
