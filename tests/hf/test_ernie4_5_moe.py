"""ERNIE 4.5's mixture (`hf/ernie4_5_moe.py`) beyond the family suite (test_hf_families.py's
"ernie4_5_moe-*" cases check logits, traces, generation, export and 16 bits against
transformers): ERNIE-4.5-21B-A3B's config read as transformers reads it, its tensors the
ones transformers writes and its counts those `attnlab info` prints (21.8B, 3.35B active per
token: the published 21B / 3B, the tied embeddings counted); what it cannot express refused
by name; the correction bias and the clamp each changing the logits; a layer pattern no
interval gives named by export."""

from __future__ import annotations

import json
import re
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from attnlab import Trace
from attnlab.cli import main
from attnlab.hf import FAMILY_BY_NAME, config_from_hf, config_to_hf, family_for_config, load_hf
from attnlab.load import inspect_dir
from attnlab.model.gpt import GPT

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.loading import hf_shapes, sparse_hf_dir

from helpers import assert_logits_match_hf, transformers_shapes

#: ERNIE-4.5-21B-A3B-PT's config.json: its values as public copies of it give them (the
#: released file itself was not at hand; keys of Baidu's own training code left out)
ERNIE_21B_A3B: dict[str, Any] = {
    "architectures": ["Ernie4_5_MoeForCausalLM"], "model_type": "ernie4_5_moe",
    "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, "hidden_act": "silu",
    "hidden_size": 2560, "intermediate_size": 12288, "max_position_embeddings": 131072,
    "moe_intermediate_size": 1536, "moe_k": 6, "moe_layer_start_index": 1,
    "moe_layer_end_index": 27, "moe_layer_interval": 1, "moe_num_experts": 64,
    "moe_num_shared_experts": 2, "num_attention_heads": 20, "num_hidden_layers": 28,
    "num_key_value_heads": 4, "head_dim": 128, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
    "vocab_size": 103424, "tie_word_embeddings": True, "use_bias": False, "use_cache": False,
    "torch_dtype": "bfloat16",
}


def test_the_released_shape_reads_and_writes_as_its_family() -> None:
    config = config_from_hf(ERNIE_21B_A3B)
    assert family_for_config(config).name == "ernie4_5_moe"
    assert config_from_hf(config_to_hf(config)) == config
    assert (config.n_experts, config.experts_per_token, config.ff_size,
            config.shared_expert_size, config.dense_d_ff, config.dense_layers,
            config.mixture_layers, config.router_scoring, config.router_norm_min,
            config.expert_weights_in_float32, config.shared_expert_gated, config.tie_weights,
            config.rope_interleaved) == (64, 6, 1536, 3072, 12288, 1, None,
                                         "softmax_corrected", 1e-12, False, False, True, True)


def test_its_tensors_and_counts_are_transformers(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    shapes, count = transformers_shapes(ERNIE_21B_A3B)
    files: dict[str, tuple[int, ...]] = {}  # as save_pretrained writes them
    for name, shape in shapes.items():
        match = re.fullmatch(r"(.*\.mlp\.experts\.)(gate_up_proj|down_proj)", name)
        if match is None:
            files[name.replace(".mlp.gate.moe_statics.", ".mlp.moe_statics.")] = shape
            continue
        E, rows, cols = shape
        parts = ["gate_proj", "up_proj"] if match[2] == "gate_up_proj" else ["down_proj"]
        for e in range(E):
            for part in parts:
                files[f"{match[1]}{e}.{part}.weight"] = (rows // len(parts), cols)
    assert hf_shapes(ERNIE_21B_A3B) == files
    directory = sparse_hf_dir(tmp_path / "ernie", ERNIE_21B_A3B, shards=3)
    info = inspect_dir(directory)
    # the correction biases (27 layers' 64) are parameters in transformers (never trained),
    # a buffer in attnlab, as GLM-4.5's are in both
    assert (info.family, info.parameters) == ("ernie4_5_moe", count - 27 * 64)
    assert info.parameters == 21_825_436_160
    # a token's: the dense first layer whole, the two shared experts and 6 of 64 routed
    assert main(["info", str(directory)]) == 0
    assert "21,825,436,160 parameters (3,352,148,480 active per token)" in (
        capsys.readouterr().out)


@pytest.mark.parametrize("field,value,why", [
    ("use_bias", True, "but not the routed experts"),
    ("moe_layer_interval", 0, "expected a positive integer"),
    ("moe_layer_start_index", 28, "none of the 28 layers is a mixture"),
    ("moe_layer_end_index", 1.5, "expected an integer"),
    ("moe_norm_min", -1.0, "expected a finite number >= 0"),
    ("moe_num_shared_experts", -1, "expected 0 or more"),
    ("moe_k", 65, "expected a positive integer up to 64"),
    ("num_experts", 32, "moe_num_experts=64 names it too; keep one"),
    ("use_rmsnorm", False, "runs RMSNorm on float weights; expected true"),
    ("is_quantized", True, "expected false"),
    ("moe_gate_act", "sigmoid", "attnlab does not know this field"),
])
def test_what_it_cannot_express_is_refused(field: str, value: Any, why: str) -> None:
    with pytest.raises(ValueError, match=rf"ernie4_5_moe config.json has {field}=.*{why}"):
        config_from_hf({**ERNIE_21B_A3B, field: value})


def test_a_layer_pattern_reads_and_exports_as_transformers_lays_it_out() -> None:
    """Mixtures every third layer from 2 to 7 of 9: transformers' (i + 1) % 3 == 0; written
    back the same. A pattern no interval gives, and GLM-4.5 (dense first layers only) holding
    a gap, are named rather than written as another model."""
    config = config_from_hf({**ERNIE_21B_A3B, "num_hidden_layers": 9, "moe_layer_interval": 3,
                             "moe_layer_start_index": 2, "moe_layer_end_index": 7})
    assert (config.mixture_layers, config.dense_layers) == ([2, 5], 0)
    assert [config.has_mixture(i) for i in range(9)] == [i in (2, 5) for i in range(9)]
    back = config_to_hf(config)
    assert (back["moe_layer_start_index"], back["moe_layer_end_index"],
            back["moe_layer_interval"]) == (2, 5, 3)
    assert config_from_hf(back) == config
    odd = replace(config, mixture_layers=[2, 3, 5])
    assert FAMILY_BY_NAME["ernie4_5_moe"].misfits(odd) == [
        "mixture_layers=[2, 3, 4, 5] (not [2, 3, 5])"]
    glm = replace(config, router_scoring="sigmoid", router_norm_min=0.0,
                  expert_weights_in_float32=True, rope_interleaved=False, rope_in_float32=False)
    assert "mixture_layers=[2, 3, 4, 5, 6, 7, 8] (not [2, 5])" in FAMILY_BY_NAME[
        "glm4_moe"].misfits(glm)


@torch.no_grad()
def test_the_correction_bias_and_the_clamp_change_the_logits(tmp_path: Path) -> None:
    """The suite's "ernie4_5_moe-interval" model: its correction bias picks other experts
    than the probabilities alone would, and its clamp (0.6) is reached by tokens whose picks
    carry less (so its weights sum under 1); zeroing either changes attnlab's logits, and
    transformers' the same way."""
    transformers = pytest.importorskip("transformers")
    from test_hf_families import hf_model

    hf = hf_model("ernie4_5_moe-interval")
    hf.save_pretrained(tmp_path)
    ours = load_hf(tmp_path)
    ids = torch.randint(1, ours.config.vocab_size, (2, 12), generator=torch.Generator())
    trace = Trace(layers=[3], names=["router_logits", "expert_weights"]).run(ours, ids)
    probs = trace.get("router_logits", 3).softmax(-1)  # (B, T, E)
    bias = ours.blocks[3].mlp.router.e_score_correction_bias  # (E,)
    picks = (probs + bias).topk(2, dim=-1)[1]  # (B, T, 2)
    assert not torch.equal(picks.sort(-1)[0], probs.topk(2, dim=-1)[1].sort(-1)[0])
    total = probs.gather(-1, picks).sum(-1)  # (B, T)
    assert (total < 0.6).any() and (total > 0.6).any()  # the clamp reached by some, not all
    torch.testing.assert_close(trace.get("expert_weights", 3).sum(-1),
                               total / total.clamp(min=0.6))
    expected = hf(ids).logits
    torch.testing.assert_close(ours(ids).logits, expected, atol=1e-5, rtol=0)
    for change in (dict(router_norm_min=0.0), dict(router_scoring="softmax")):
        other = GPT(replace(ours.config, **change))
        other.load_state_dict(ours.state_dict(), strict="router_scoring" not in change)
        assert not torch.allclose(other(ids).logits, expected, atol=1e-3)
    hf.config.moe_norm_min = 1e-12
    for layer in hf.model.layers:
        if isinstance(layer.mlp, transformers.models.ernie4_5_moe.modeling_ernie4_5_moe
                      .Ernie4_5_MoeSparseMoeBlock):
            layer.mlp.gate.norm_min = 1e-12
    other = GPT(replace(ours.config, router_norm_min=1e-12))
    other.load_state_dict(ours.state_dict())
    torch.testing.assert_close(other(ids).logits, hf(ids).logits, atol=1e-5, rtol=0)


@torch.no_grad()
def test_a_16_bit_load_keeps_the_correction_bias_and_router_float32(tmp_path: Path) -> None:
    """(1, E) in the files, (E,) on the router, float32 whatever the model's dtype; the
    router's weight float32 too, as transformers keeps it."""
    transformers = pytest.importorskip("transformers")
    config = transformers.Ernie4_5_MoeConfig(
        vocab_size=61, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, moe_num_experts=4,
        moe_k=2, moe_num_shared_experts=1)
    hf = transformers.Ernie4_5_MoeForCausalLM(config)
    bias = hf.model.layers[1].mlp.gate.moe_statics.e_score_correction_bias  # (1, E)
    bias.copy_(torch.tensor([[0.1234567, -0.7654321, 1e-3 + 1e-7, 2.0]]))
    hf.save_pretrained(tmp_path)
    ours = load_hf(tmp_path, dtype=torch.bfloat16)
    weight = hf.model.layers[1].mlp.gate.weight  # (E, C)
    assert ours.blocks[1].mlp.experts[0].fc.weight.dtype == torch.bfloat16
    for model in (ours, ours.to(torch.float16), ours.float().bfloat16()):
        router = model.blocks[1].mlp.router
        kept = router.e_score_correction_bias
        assert kept.dtype == torch.float32 and torch.equal(kept, bias[0])
        assert router.weight.dtype == torch.float32 and torch.equal(router.weight, weight)


def test_baidus_own_keys_and_its_mtp_tensors_are_left_as_transformers_leaves_them(
        tmp_path: Path) -> None:
    """Baidu's configs also state keys transformers reads nowhere (the gate's training kernel,
    the correction bias's switch, the multi-token-prediction layers) and their files may hold
    that layer's "mtp" tensors, which transformers skips: the same model, the same logits; a
    tensor of no such name is still a weight left over."""
    transformers = pytest.importorskip("transformers")
    from safetensors.torch import load_file, save_file

    baidu = dict(moe_gate="topk", moe_use_aux_free=True, num_nextn_predict_layers=1,
                 multi_token_pred_lambda=0.3, use_rmsnorm=True, is_quantized=False)
    assert config_from_hf({**ERNIE_21B_A3B, **baidu}) == config_from_hf(ERNIE_21B_A3B)
    config = transformers.Ernie4_5_MoeConfig(
        vocab_size=61, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, moe_num_experts=4,
        moe_k=2, moe_num_shared_experts=1)
    config._attn_implementation = "eager"
    hf = transformers.Ernie4_5_MoeForCausalLM(config).eval()
    hf.save_pretrained(tmp_path)
    path = tmp_path / "model.safetensors"
    mtp = {"model.mtp_block.0.self_attn.q_proj.weight": torch.randn(32, 32),
           "model.mtp_linear_proj.0.weight": torch.randn(32, 64)}
    save_file({**load_file(str(path)), **mtp}, str(path), metadata={"format": "pt"})
    written = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**written, **baidu}))
    assert_logits_match_hf(load_hf(tmp_path), hf, [7, 4])
    save_file({**load_file(str(path)), "model.layers.0.extra.weight": torch.ones(2)},
              str(path), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"does not account for: \['model\.layers\.0\.extra"):
        load_hf(tmp_path)
