"""gpt-oss beyond the family suite (tests/hf/test_hf_families.py runs its random-weight cases
through every family test): its released config.json, and its experts stored as MXFP4."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from benchmarks.gpt_oss import EXPERTS, GPT_OSS_20B, packed_hf_dir
from benchmarks.loading import sparse_hf_dir

from attnlab import load_hf
from attnlab.cli import main
from attnlab.hf import config_from_hf
from attnlab.load import inspect_dir
from helpers import assert_logits_match_hf

transformers = pytest.importorskip("transformers")



def test_the_released_config_reads_as_gpt_oss_20b(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """Its 20.9B parameters, 3.6B of them active per token besides the token table (OpenAI's
    model card counts 20.91B and 3.61B active, the embedding left out of the second), from a
    sparse directory of float tensors; the windows on every other layer from 0."""
    unquantized = {k: v for k, v in GPT_OSS_20B.items() if k != "quantization_config"}
    directory = sparse_hf_dir(tmp_path / "oss", unquantized, shards=3)
    info = inspect_dir(directory)
    config = config_from_hf(GPT_OSS_20B)
    assert (config.window_layers, config.sliding_window) == (list(range(0, 24, 2)), 128)
    assert config.attn_sinks and config.mlp == "clamped_swiglu" and config.router_bias
    assert main(["info", str(directory)]) == 0
    out = capsys.readouterr().out
    assert info.family == "gpt_oss" and f"{info.parameters:,} parameters" in out
    active = int(out.split("parameters (")[1].split(" active")[0].replace(",", ""))
    assert 20.90e9 < info.parameters < 20.92e9
    assert 3.60e9 < active - 201088 * 2880 < 3.62e9  # without the (V, C) token table


def _quantized_pair(tmp_path: Path) -> tuple[Any, Path]:
    """A random gpt-oss with its experts' MXFP4 blocks and scales drawn at random: its
    transformers model holding them as transformers' dequantization gives them (float32),
    and a directory that stores them packed, as the released checkpoints do."""
    from safetensors.torch import save_file
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    torch.manual_seed(0)
    config = transformers.GptOssConfig(
        vocab_size=97, hidden_size=64, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4,
        num_experts_per_tok=2, sliding_window=4, max_position_embeddings=128,
        initializer_range=0.2, rope_parameters=dict(rope_type="default", rope_theta=1e4))
    config._attn_implementation = "eager"
    config._experts_implementation = "eager"
    hf = transformers.GptOssForCausalLM(config).eval()
    state = {k: v.contiguous() for k, v in hf.state_dict().items()}
    generator = torch.Generator().manual_seed(1)
    for name in [k for k in state if k.endswith(EXPERTS)]:
        E, n_in, n_out = state.pop(name).shape  # (E, in, out)
        blocks = torch.randint(0, 256, (E, n_out, n_in // 32, 16), dtype=torch.uint8,
                               generator=generator)
        scales = torch.randint(120, 126, (E, n_out, n_in // 32), dtype=torch.uint8,
                               generator=generator)
        state[f"{name}_blocks"], state[f"{name}_scales"] = blocks, scales
        with torch.no_grad():
            hf.get_parameter(name).copy_(convert_moe_packed_tensors(
                blocks, scales, dtype=torch.float32))  # (E, in, out)
    directory = tmp_path / "packed"
    directory.mkdir()
    save_file(state, str(directory / "model.safetensors"))
    written = {**config.to_dict(), "architectures": ["GptOssForCausalLM"],
               "quantization_config": {"quant_method": "mxfp4"}}
    (directory / "config.json").write_text(json.dumps(written))
    return hf, directory


def test_mxfp4_experts_load_as_transformers_dequantizes_them(tmp_path: Path) -> None:
    hf, directory = _quantized_pair(tmp_path)
    ours = load_hf(directory)
    for i, layer in enumerate(hf.model.layers):
        experts = layer.mlp.experts
        for e in range(experts.num_experts):
            mine = ours.blocks[i].mlp.experts[e]
            assert torch.equal(mine.gate.weight, experts.gate_up_proj[e][:, ::2].t())
            assert torch.equal(mine.fc.weight, experts.gate_up_proj[e][:, 1::2].t())
            assert torch.equal(mine.proj.weight, experts.down_proj[e].t())
    assert_logits_match_hf(ours, hf, [5, 17, 11])
    info = inspect_dir(directory)
    assert info.parameters == sum(p.numel() for p in hf.parameters())


def test_other_quantizations_are_refused(tmp_path: Path) -> None:
    _, directory = _quantized_pair(tmp_path)
    written = json.loads((directory / "config.json").read_text())
    written["quantization_config"] = {"quant_method": "bitsandbytes"}
    (directory / "config.json").write_text(json.dumps(written))
    with pytest.raises(ValueError, match=r"quantization_config.*quant_method .mxfp4."):
        load_hf(directory)


def test_the_released_quantized_directory_opens_as_20b_parameters(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """gpt-oss-20b's directory as released, its experts as MXFP4 bytes (a sparse file of its
    tensors' names, shapes and dtypes): `attnlab info` counts the dequantized model's
    parameters, nothing read, and says what loading it in bfloat16 needs, dequantized and
    with its experts packed."""
    directory = packed_hf_dir(tmp_path / "gpt-oss-20b", GPT_OSS_20B)
    info = inspect_dir(directory)
    assert info.parameters == 20_914_757_184
    assert main(["info", str(directory)]) == 0
    out, err = capsys.readouterr()
    assert "20,914,757,184 parameters" in out and "bfloat16 + MXFP4 experts 14.9 GB" in out
    assert "note: the experts are stored as MXFP4" in err
    # packed: the 19.1B expert weights at 4.25 bits, the rest in bfloat16
    assert info.packed is not None
    weights, nbytes, largest, what = info.packed
    assert what == "MXFP4 experts"
    assert weights == 19_110_297_600 and nbytes * 32 == weights * 17
    memory = info.memory("cpu")
    packed = memory["bfloat16 + MXFP4 experts"]["bytes"]
    assert packed == 2 * (info.parameters - weights) + nbytes + largest
    assert memory["bfloat16"]["bytes"] > 2.8 * packed
