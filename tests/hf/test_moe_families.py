"""The mixture-of-experts families (`hf/mixtral.py`, `olmoe.py`, `qwen3_moe.py`,
`granitemoe.py`, `qwen2_moe.py`): Mixtral-8x7B's and Qwen3-30B-A3B's config.json as
published, and configs of OLMoE-1B-7B's, Granite-3.0-1B-A400M's and Qwen1.5-MoE-A2.7B's
shape, read as transformers reads them; their tensors named and shaped as transformers
writes them (one tensor per expert, or GraniteMoE's two 3-D ones a layer, where its classes
hold each layer's experts in two in memory); what they cannot express refused by name; the
balance term of the training loss and a state dict in memory as transformers'. The family
suite (test_hf_families.py's "mixtral-*", "olmoe-*", "qwen3_moe-*", "granitemoe-*" and
"qwen2_moe-*" cases) checks logits, traces, generation and export against transformers."""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from attnlab import GPT
from attnlab.cli import main
from attnlab.hf import (
    FAMILY_BY_NAME,
    config_from_hf,
    config_to_hf,
    family_for_config,
    gpt_from_hf,
    load_hf,
)
from attnlab.load import inspect_dir

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.loading import hf_shapes, sparse_hf_dir

from helpers import transformers_shapes

#: Mixtral-8x7B-v0.1's config.json as published
MIXTRAL_8X7B = {
    "architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1,
    "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
    "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mixtral",
    "num_attention_heads": 32, "num_experts_per_tok": 2, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "num_local_experts": 8, "output_router_logits": False,
    "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.02,
    "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "transformers_version": "4.36.0.dev0", "use_cache": True, "vocab_size": 32000,
}
#: Qwen3-30B-A3B's config.json as published
QWEN3_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128,
    "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
    "intermediate_size": 6144, "max_position_embeddings": 40960, "max_window_layers": 48,
    "mlp_only_layers": [], "model_type": "qwen3_moe", "moe_intermediate_size": 768,
    "norm_topk_prob": True, "num_attention_heads": 32, "num_experts": 128,
    "num_experts_per_tok": 8, "num_hidden_layers": 48, "num_key_value_heads": 4,
    "output_router_logits": False, "rms_norm_eps": 1e-06, "rope_scaling": None,
    "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001, "sliding_window": None,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
    "use_cache": True, "use_sliding_window": False, "vocab_size": 151936,
}
#: a config of OLMoE-1B-7B's shape and switches (64 experts 1024 wide, top 8 as the
#: router's probabilities, QK-norm over the whole q and k)
OLMOE_1B_7B = {
    "architectures": ["OlmoeForCausalLM"], "model_type": "olmoe", "hidden_size": 2048,
    "intermediate_size": 1024, "num_hidden_layers": 16, "num_attention_heads": 16,
    "num_key_value_heads": 16, "num_experts": 64, "num_experts_per_tok": 8,
    "norm_topk_prob": False, "clip_qkv": None, "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "tie_word_embeddings": False,
    "vocab_size": 50304, "output_router_logits": False, "router_aux_loss_coef": 0.01,
}
#: a config of Granite-3.0-1B-A400M's shape and scalars (32 experts 512 wide in two 3-D
#: tensors a layer, top 8 weighed by a softmax of their logits)
GRANITEMOE_1B = {
    "architectures": ["GraniteMoeForCausalLM"], "model_type": "granitemoe", "hidden_size": 1024,
    "intermediate_size": 512, "num_hidden_layers": 24, "num_attention_heads": 16,
    "num_key_value_heads": 8, "num_local_experts": 32, "num_experts_per_tok": 8,
    "vocab_size": 49155, "tie_word_embeddings": True, "embedding_multiplier": 12.0,
    "residual_multiplier": 0.22, "attention_multiplier": 0.015625, "logits_scaling": 6.0,
    "rms_norm_eps": 1e-06, "rope_theta": 10000.0, "max_position_embeddings": 4096,
}
#: a config of Qwen1.5-MoE-A2.7B's shape (60 experts 1408 wide, top 4 as the router's
#: probabilities, a shared expert 5632 wide)
QWEN1_5_MOE = {
    "architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "hidden_size": 2048,
    "intermediate_size": 5632, "moe_intermediate_size": 1408,
    "shared_expert_intermediate_size": 5632, "num_hidden_layers": 24, "num_attention_heads": 16,
    "num_key_value_heads": 16, "num_experts": 60, "num_experts_per_tok": 4,
    "norm_topk_prob": False, "decoder_sparse_step": 1, "max_position_embeddings": 8192,
    "max_window_layers": 21, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
    "sliding_window": 32768, "use_sliding_window": False, "tie_word_embeddings": False,
    "vocab_size": 151936, "router_aux_loss_coef": 0.001,
}
CONFIGS = {"mixtral": MIXTRAL_8X7B, "qwen3_moe": QWEN3_30B_A3B, "olmoe": OLMOE_1B_7B,
           "granitemoe": GRANITEMOE_1B, "qwen2_moe": QWEN1_5_MOE}


def _per_expert(shapes: dict[str, tuple[int, ...]], family: str) -> dict[str, tuple[int, ...]]:
    """transformers' in-memory names and shapes as its save_pretrained writes them: each
    layer's experts.gate_up_proj (E, 2F, C) and experts.down_proj (E, C, F) as E tensors
    each, under the family's names."""
    if family == "granitemoe":  # its files stack the experts too, under other names
        renamed = {"router.weight": "router.layer.weight",
                   "experts.gate_up_proj": "input_linear.weight",
                   "experts.down_proj": "output_linear.weight"}
        return {re.sub(r"block_sparse_moe\.(.*)$", lambda m: "block_sparse_moe."
                       + renamed.get(m[1], m[1]), name): shape for name, shape in shapes.items()}
    names = {"mixtral": ("block_sparse_moe", "w1", "w3", "w2")}.get(
        family, ("mlp", "gate_proj", "up_proj", "down_proj"))
    moe, gate, up, down = names
    out: dict[str, tuple[int, ...]] = {}
    for name, shape in shapes.items():
        match = re.fullmatch(r"(model\.layers\.\d+\.)mlp\.(experts\.(gate_up_proj|down_proj)|"
                             r"gate\.weight)", name)
        if match is None:
            out[name] = shape
        elif match[2] == "gate.weight":
            out[f"{match[1]}{moe}.gate.weight"] = shape
        else:
            E, rows, cols = shape
            parts = [(gate, rows // 2), (up, rows // 2)] if match[3] == "gate_up_proj" else [
                (down, rows)]
            for e in range(E):
                for part, n in parts:
                    out[f"{match[1]}{moe}.experts.{e}.{part}.weight"] = (n, cols)
    return out


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_a_published_config_reads_and_writes_as_its_family(family: str) -> None:
    config = config_from_hf(CONFIGS[family])
    assert family_for_config(config).name == family
    assert config_from_hf(config_to_hf(config)) == config
    expected = {"mixtral": (8, 2, True, True, 14336, 128, False, False),
                "qwen3_moe": (128, 8, True, False, 768, 128, False, False),
                "olmoe": (64, 8, False, False, 1024, 128, True, False),
                "granitemoe": (32, 8, True, False, 512, 64, False, True),
                "qwen2_moe": (60, 4, False, False, 1408, 128, False, False)}[family]
    assert (config.n_experts, config.experts_per_token, config.experts_normalized,
            config.expert_weights_in_float32, config.ff_size, config.head_size,
            config.qk_norm_whole, config.experts_from_top_logits) == expected


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_its_tensors_are_the_ones_transformers_writes(family: str, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    shapes, count = transformers_shapes(CONFIGS[family])
    assert hf_shapes(CONFIGS[family]) == _per_expert(shapes, family)
    directory = sparse_hf_dir(tmp_path / family, CONFIGS[family], shards=3)
    info = inspect_dir(directory)
    assert (info.family, info.parameters) == (family, count)
    # the parameters a token's forward uses: Mixtral-8x7B's 12.9B, Qwen3-30B-A3B's 3.3B,
    # OLMoE-1B-7B's 1.3B, Granite-3.0-1B-A400M's 0.43B (of 1.33B), Qwen1.5-MoE-A2.7B's 2.7B
    # (its shared expert included)
    active = {"mixtral": 12_879_925_248, "qwen3_moe": 3_353_032_704,
              "olmoe": 1_282_017_280, "granitemoe": 428_658_688,
              "qwen2_moe": 2_689_173_504}[family]
    assert main(["info", str(directory)]) == 0
    assert f"{count:,} parameters ({active:,} active per token)" in capsys.readouterr().out


@pytest.mark.parametrize("family,field,value,why", [
    ("mixtral", "num_experts_per_tok", 9, "expected a positive integer up to 8"),
    ("olmoe", "clip_qkv", 8.0, "attnlab supports None"),
    ("qwen3_moe", "mlp_only_layers", [0, 5], "attnlab supports \\[\\]"),
    ("qwen3_moe", "decoder_sparse_step", 2, "attnlab supports 1"),
    ("qwen3_moe", "use_sliding_window", True, "attnlab supports False"),
    ("qwen3_moe", "num_local_experts", 64, "num_experts=128 names the experts too; keep one"),
])
def test_what_a_mixture_family_cannot_express_is_refused(family: str, field: str, value: Any,
                                                         why: str) -> None:
    with pytest.raises(ValueError, match=rf"{family} config.json has {field}=.*: {why}"):
        config_from_hf({**CONFIGS[family], field: value})


def test_no_dense_family_writes_a_mixture_and_no_mixture_family_a_dense_model() -> None:
    mixtral = config_from_hf(MIXTRAL_8X7B)
    for name, family in FAMILY_BY_NAME.items():
        misfits = family.misfits(mixtral)
        assert (misfits == []) == (name == "mixtral"), name
        if name in ("llama", "mistral"):
            assert "n_experts=None (not 8)" in misfits
    moe_fields = ("num_local_experts", "num_experts_per_tok", "output_router_logits",
                  "router_aux_loss_coef")
    dense = config_from_hf({**{k: v for k, v in MIXTRAL_8X7B.items() if k not in moe_fields},
                            "architectures": ["MistralForCausalLM"], "model_type": "mistral"})
    assert dense.n_experts is None and family_for_config(dense).name == "llama"  # no window
    assert "n_experts=8 (not None)" in FAMILY_BY_NAME["mixtral"].misfits(dense)


@pytest.mark.parametrize("prefix,experts", [("Mixtral", "num_local_experts"),
                                            ("Olmoe", "num_experts")])
def test_the_training_loss_with_the_balance_term_is_transformers(prefix: str, experts: str,
                                                                 tmp_path: Path) -> None:
    """router_aux_loss_coef: the next-token loss plus coef times the load-balancing term,
    equal to transformers' loss with output_router_logits, over a left-padded batch (its
    labels also drop the first real token's, which attnlab's targets leave out: the position
    before it is padding)."""
    transformers = pytest.importorskip("transformers")
    hf_config = getattr(transformers, f"{prefix}Config")(
        vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        num_experts_per_tok=2, router_aux_loss_coef=0.02, **{experts: 4})
    hf_config._attn_implementation, hf_config._experts_implementation = "eager", "eager"
    torch.manual_seed(0)
    hf = getattr(transformers, f"{prefix}ForCausalLM")(hf_config)
    hf.save_pretrained(tmp_path)
    loaded = load_hf(tmp_path)
    ours = GPT(dataclasses.replace(loaded.config, router_aux_loss_coef=0.02))
    ours.load_state_dict(loaded.state_dict())
    hf.train(), ours.train()
    ids = torch.randint(0, 97, (3, 12), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(3, 12, dtype=torch.long)
    mask[1, :4] = 0
    labels = ids.masked_fill(mask == 0, -100)
    labels[1, 4] = -100
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    expected = hf(ids, attention_mask=mask, position_ids=positions, labels=labels,
                  output_router_logits=True)
    targets = torch.cat([ids[:, 1:], torch.full((3, 1), -1)], dim=1)  # (B, T)
    loss = ours(ids, attention_mask=mask, targets=targets).loss
    assert float(expected.aux_loss.detach()) > 1.0  # the term is there: 2 for an even router
    torch.testing.assert_close(loss, expected.loss, atol=2e-6, rtol=0)


@pytest.mark.parametrize("prefix,fields", [
    ("Mixtral", dict(num_local_experts=4)), ("Olmoe", dict(num_experts=4)),
    ("Qwen3Moe", dict(num_experts=4, moe_intermediate_size=24, norm_topk_prob=True)),
    ("GraniteMoe", dict(num_local_experts=4, embedding_multiplier=2.0)),
    ("Qwen2Moe", dict(num_experts=4, moe_intermediate_size=24,
                      shared_expert_intermediate_size=40))])
def test_a_state_dict_in_memory_splits_its_experts(prefix: str, fields: dict[str, Any]) -> None:
    """gpt_from_hf(model.config.to_dict(), model.state_dict()): transformers 5 holds each
    layer's experts as two 3-D tensors in memory (not the files' tensor per expert; GraniteMoE's
    files stack them too, under other names), which attnlab splits; the logits are
    transformers'."""
    transformers = pytest.importorskip("transformers")
    config = getattr(transformers, f"{prefix}Config")(
        vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, num_experts_per_tok=2, **fields)
    config._attn_implementation, config._experts_implementation = "eager", "eager"
    torch.manual_seed(0)
    hf = getattr(transformers, f"{prefix}ForCausalLM")(config).eval()
    assert any(name.endswith("experts.gate_up_proj") for name in hf.state_dict())  # 3-D
    ours = gpt_from_hf(config.to_dict(), hf.state_dict())
    ids = torch.randint(0, 97, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits, hf(ids).logits, atol=1e-6, rtol=0)
