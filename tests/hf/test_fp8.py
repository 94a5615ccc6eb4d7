"""Block-quantized FP8 checkpoints (`hf/fp8.py`: DeepSeek-V3's and Qwen3-FP8's format) load
dequantized: each value times its block's scale in float32, rounded once to the dtype asked
for, as transformers' `FineGrainedFP8Config(dequantize=True)` loads them (the same tensors
bit for bit), partial blocks as DeepSeek's `weight_dequant` has them, and what attnlab cannot
read refused by name."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

from attnlab import load_hf
from attnlab.cli import main
from attnlab.load import inspect_dir
from attnlab.model.fp8 import dequantize_fp8, quantize_fp8

transformers = pytest.importorskip("transformers")

FP8_CONFIG = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
              "weight_block_size": [128, 128]}


def _fp8_dir(source: Path, target: Path, block: tuple[int, int] = (128, 128),
             **quantization: Any) -> Path:
    """`source`'s model with every attention and MLP matrix stored as FP8 (the embeddings,
    norms and head as they are, as DeepSeek-V3's release keeps them)."""
    target.mkdir(parents=True)
    state = load_file(str(source / "model.safetensors"))
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if tensor.dim() == 2 and ("_proj" in name) and "layers" in name:
            out[name], out[name + "_scale_inv"] = quantize_fp8(tensor, block)
        else:
            out[name] = tensor
    save_file(out, str(target / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((source / "config.json").read_text())
    config["quantization_config"] = {**FP8_CONFIG, "weight_block_size": list(block),
                                     **quantization}
    (target / "config.json").write_text(json.dumps(config))
    return target


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 40), cols=st.integers(1, 40), bm=st.sampled_from([1, 4, 16]),
       bn=st.sampled_from([1, 8, 16]), seed=st.integers(0, 99))
def test_each_value_is_times_its_blocks_scale_in_one_float32_product(
        rows: int, cols: int, bm: int, bn: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(rows, cols, generator=g) * 100).to(torch.float8_e4m3fn)
    scale = torch.rand(-(-rows // bm), -(-cols // bn), generator=g) * 1e-2  # (R, C)
    got = dequantize_fp8(q, scale, (bm, bn))
    expected = torch.empty(rows, cols)
    for i in range(rows):  # partial last blocks where a side is no multiple of the block
        for j in range(cols):
            expected[i, j] = q[i, j].float() * scale[i // bm, j // bn]
    assert got.dtype == torch.float32 and torch.equal(got, expected)
    again, scales = quantize_fp8(got, (bm, bn))  # each block's largest magnitude at 448
    back = dequantize_fp8(again, scales, (bm, bn))
    torch.testing.assert_close(back.abs().amax(), got.abs().amax(), rtol=1e-6, atol=1e-30)
    torch.testing.assert_close(back, got, rtol=2 ** -4, atol=float(scales.max()) * 2 ** -9)


def _small(name: str) -> Any:
    torch.manual_seed(0)
    if name == "qwen3":
        config = transformers.Qwen3Config(
            vocab_size=97, hidden_size=256, intermediate_size=384, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=64,
            max_position_embeddings=64)
        return transformers.Qwen3ForCausalLM(config).eval()
    # latent attention, each matrix's sides multiples of 128 (transformers' dequantizer
    # needs them: DeepSeek-V3's own kv_a_proj_with_mqa, 576 rows, it refuses)
    config = transformers.DeepseekV3Config(
        vocab_size=97, hidden_size=256, intermediate_size=384, moe_intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2, kv_lora_rank=128,
        q_lora_rank=128, qk_rope_head_dim=128, qk_nope_head_dim=64, v_head_dim=64,
        n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
        n_shared_experts=1, first_k_dense_replace=1, max_position_embeddings=64)
    return transformers.DeepseekV3ForCausalLM(config).eval()


@pytest.mark.parametrize("family", ["qwen3", "deepseek_v3"])
@torch.no_grad()
def test_the_tensors_are_transformers_dequantized_ones_bit_for_bit(
        family: str, tmp_path: Path) -> None:
    pytest.importorskip("accelerate")  # transformers' FP8 loader needs it
    _small(family).save_pretrained(tmp_path / "float")
    directory = _fp8_dir(tmp_path / "float", tmp_path / "fp8")
    ids = torch.randint(0, 97, (2, 12), generator=torch.Generator().manual_seed(1))
    for dtype in (torch.float32, torch.bfloat16):
        hf = transformers.AutoModelForCausalLM.from_pretrained(
            directory, dtype=dtype,
            quantization_config=transformers.FineGrainedFP8Config(dequantize=True)).eval()
        ours = load_hf(directory, dtype=dtype)
        hf_state = hf.state_dict()
        if family == "qwen3":
            pairs = [("blocks.1.attn.query.weight", "model.layers.1.self_attn.q_proj.weight"),
                     ("blocks.0.mlp.proj.weight", "model.layers.0.mlp.down_proj.weight")]
        else:
            pairs = [("blocks.1.attn.kv_up.weight", "model.layers.1.self_attn.kv_b_proj.weight"),
                     ("blocks.0.mlp.gate.weight", "model.layers.0.mlp.gate_proj.weight")]
        for mine, theirs in pairs:
            assert ours.state_dict()[mine].dtype == dtype
            assert torch.equal(ours.state_dict()[mine], hf_state[theirs]), (mine, dtype)
        if dtype == torch.float32:
            torch.testing.assert_close(ours(ids).logits, hf(ids).logits, atol=1e-4, rtol=0)


@torch.no_grad()
def test_a_side_no_multiple_of_the_block_loads_with_a_partial_block(tmp_path: Path) -> None:
    """DeepSeek-V3's kv_a_proj_with_mqa is 576 rows: 4.5 blocks of 128. transformers refuses
    such a grid; attnlab reads it as DeepSeek's own weight_dequant does."""
    _small("qwen3").save_pretrained(tmp_path / "float")
    directory = _fp8_dir(tmp_path / "float", tmp_path / "fp8", block=(96, 160))
    stored = load_file(str(directory / "model.safetensors"))
    q = stored["model.layers.0.self_attn.q_proj.weight"]  # (256, 256): 3 x 2 partial blocks
    scale = stored["model.layers.0.self_attn.q_proj.weight_scale_inv"]
    assert tuple(scale.shape) == (3, 2)
    expected = q.float() * scale.repeat_interleave(96, 0)[:256].repeat_interleave(160, 1)[
        :, :256]
    ours = load_hf(directory)
    assert torch.equal(ours.blocks[0].attn.query.weight, expected)
    original = load_file(str(tmp_path / "float" / "model.safetensors"))
    w = original["model.layers.0.self_attn.q_proj.weight"]
    assert (expected - w).abs().max() <= w.abs().max() / 8  # FP8's few bits, not garbage


def test_info_names_the_fp8_weights_and_counts_them_dequantized(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _small("qwen3").save_pretrained(tmp_path / "float")
    directory = _fp8_dir(tmp_path / "float", tmp_path / "fp8")
    shutil.copy(Path(__file__).parents[1] / "data" / "v0.2_hf_llama" / "tokenizer.json",
                directory)
    fp8, plain = inspect_dir(directory), inspect_dir(tmp_path / "float")
    assert fp8.parameters == plain.parameters and fp8.tensors == plain.tensors
    assert set(fp8.stored) == {"float8_e4m3fn", "float32"}
    assert any("14 matrices are stored as FP8 (e4m3, 128 x 128 blocks)" in n for n in fp8.notes)
    assert main(["info", str(directory)]) == 0
    captured = capsys.readouterr()
    assert "float8_e4m3fn" in captured.out and "stored as FP8" in captured.err


@pytest.mark.parametrize(("change", "message"), [
    (dict(fmt="e5m2"), "quantization_config.fmt='e5m2': attnlab reads FP8 weights stored as "
                       "e4m3"),
    (dict(activation_scheme="static"), "activation_scheme='static': attnlab reads weights "
                                       "quantized with dynamic activations"),
    (dict(weight_block_size=[128]), r"weight_block_size=\[128\]: attnlab reads per-block "
                                    "scales"),
    (dict(fp8_layout="x"), "quantization_config.fp8_layout='x': attnlab does not know this "
                           "FP8 field"),
    (dict(quant_method="awq"), r"qwen3 config.json has quantization_config=\{.*'awq'.*\}: "
                               "attnlab loads float weights, and FP8 ones"),
])
def test_what_attnlab_cannot_read_is_refused_by_name(change: dict[str, Any], message: str,
                                                     tmp_path: Path) -> None:
    _small("qwen3").save_pretrained(tmp_path / "float")
    directory = _fp8_dir(tmp_path / "float", tmp_path / "fp8", **change)
    with pytest.raises(ValueError, match=message):
        load_hf(directory)


def test_a_scale_grid_that_does_not_fit_its_weight_names_the_tensor(tmp_path: Path) -> None:
    _small("qwen3").save_pretrained(tmp_path / "float")
    directory = _fp8_dir(tmp_path / "float", tmp_path / "fp8")
    config = json.loads((directory / "config.json").read_text())
    config["quantization_config"]["weight_block_size"] = [64, 128]  # the grid is 128 x 128's
    (directory / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"tensor 'model.layers.0.mlp.down_proj.weight' of "
                                         r"model.safetensors: an FP8 weight \(256, 384\) "
                                         r"torch.float8_e4m3fn with scales \(2, 3\) "
                                         r"torch.float32: 64 x 128 blocks need .* \(4, 3\)"):
        inspect_dir(directory)  # from the headers: nothing read


@torch.no_grad()
def test_the_loading_benchmarks_fp8_release_loads_near_its_float_values(tmp_path: Path) -> None:
    """benchmarks/loading.py's FP8 directory (its load is a row there): every matrix within
    FP8's reach of the values it was quantized from."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from benchmarks.loading import LLAMA_1B, fp8_hf_dir

    small = {**LLAMA_1B, "num_hidden_layers": 1, "hidden_size": 256, "intermediate_size": 384,
             "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 97}
    directory = fp8_hf_dir(tmp_path / "fp8", small, shards=2)
    model = load_hf(directory, dtype=torch.bfloat16)
    stored = {}
    for shard in directory.glob("*.safetensors"):
        stored.update(load_file(str(shard)))
    assert stored["model.layers.0.mlp.up_proj.weight"].dtype == torch.float8_e4m3fn
    assert stored["model.embed_tokens.weight"].dtype == torch.bfloat16
    up = model.blocks[0].mlp.fc.weight.float()  # (384, 256)
    assert up.abs().max() > 0.05 and up.std() == pytest.approx(0.02, rel=0.1)


@pytest.mark.parametrize("family", ["qwen3", "deepseek_v3"])
@torch.no_grad()
def test_matrices_kept_fp8_give_the_dequantized_models_logits(family: str,
                                                              tmp_path: Path) -> None:
    """packed=True keeps every matrix the files store FP8 as an `Fp8Linear` (its e4m3 bytes
    uint8, its scales float32 whatever the model's dtype): the dequantized model's logits bit
    for bit in float32 and bfloat16, at about a quarter (a half in bfloat16) of the matrices'
    bytes; the lens reads a packed output projection's weight dequantized."""
    from attnlab.interp.lens import logit_attribution
    from attnlab.model.fp8 import Fp8Linear
    from attnlab.model.packed import packed_layers, packed_size

    _small(family).save_pretrained(tmp_path / "float")
    directory = _fp8_dir(tmp_path / "float", tmp_path / "fp8")
    ids = torch.randint(0, 97, (2, 12), generator=torch.Generator().manual_seed(2))
    for dtype in (torch.float32, torch.bfloat16):
        plain = load_hf(directory, dtype=dtype, packed=False)
        packed = load_hf(directory, dtype=dtype, packed=True)
        layers = packed_layers(packed)
        stored = {"qwen3": 14, "deepseek_v3": 28}[family]  # every _proj matrix of a layer
        assert len(layers) == stored and all(isinstance(m, Fp8Linear) for m in layers)
        assert all(m.weight.dtype == torch.uint8 and m.weight_scale_inv.dtype == torch.float32
                   for m in layers)
        weights, nbytes = packed_size(packed)
        assert nbytes < weights * 1.01  # a byte a weight and its block's share of a scale
        assert torch.equal(packed(ids).logits, plain(ids).logits)
        got = logit_attribution(packed, ids[:1], target=5)
        want = logit_attribution(plain, ids[:1], target=5)
        # the same values; the plain weight's laid-out memory may sum in another order
        torch.testing.assert_close(got.heads, want.heads, rtol=1e-5, atol=1e-6)
    moved = packed.to(torch.float16)
    assert {m.weight_scale_inv.dtype for m in packed_layers(moved)} == {torch.float32}


@torch.no_grad()
def test_a_load_keeps_fp8_where_the_dequantized_model_would_not_fit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from attnlab.model import memory
    from attnlab.model.packed import packed_layers

    _small("qwen3").save_pretrained(tmp_path / "float")
    directory = _fp8_dir(tmp_path / "float", tmp_path / "fp8")
    shutil.copy(Path(__file__).parents[1] / "data" / "v0.2_hf_llama" / "tokenizer.json",
                directory)
    report = inspect_dir(directory).memory("cpu")
    small, full = report["float32 + FP8 matrices"]["bytes"], report["float32"]["bytes"]
    assert small < full / 2
    assert not packed_layers(load_hf(directory))  # room: dequantized
    argv = ["generate", str(directory), "hat", "--max_new_tokens", "4", "--seed", "1"]
    assert main(argv) == 0
    roomy = capsys.readouterr()
    monkeypatch.setattr(memory, "available_bytes", lambda device: (small + full) // 2)
    assert len(packed_layers(load_hf(directory))) == 14
    assert main(argv) == 0  # through the model's forward: the decode step stacks no FP8
    tight = capsys.readouterr()
    assert "14 matrices stay packed as FP8" in tight.err and tight.out == roomy.out
    from attnlab import save_hf

    with pytest.raises(ValueError, match="save_hf: this model holds 14 matrices packed as FP8"):
        save_hf(tmp_path / "out", load_hf(directory))
