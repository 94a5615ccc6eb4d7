"""gpt-oss's MXFP4 experts kept packed in memory (`model/mxfp4.py`'s `Mxfp4Linear`): the
same values as the dequantization, the same logits and generations as a model whose experts
were dequantized on load, a quarter of the experts' bytes, chosen by the fit check where
the dequantized model would not fit, and refused by name where packed bytes cannot go."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import attnlab.model.memory as memory
from attnlab import load_hf, save_hf
from attnlab.checkpoint import Checkpoint, save_checkpoint
from attnlab.cli import main
from attnlab.generate import generate
from attnlab.load import inspect_dir
from attnlab.model.gpt import laid_out
from attnlab.model.layers import Linear
from attnlab.model.mxfp4 import (
    BLOCK_BYTES,
    NAN_SCALE,
    Mxfp4Linear,
    dequantize,
    unpack,
)
from attnlab.model.packed import packed_layers
from attnlab.train import TrainConfig, train
from attnlab.train.data import TextDataset
from helpers import make_tokenizer, random_ids

pytest.importorskip("transformers")
from test_gpt_oss import _quantized_pair

TOKENIZER = Path(__file__).resolve().parents[1] / "data" / "v0.2_hf_llama" / "tokenizer.json"


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    hf, directory = _quantized_pair(tmp_path_factory.mktemp("oss"))
    shutil.copy(TOKENIZER, directory / "tokenizer.json")  # for the commands
    return hf, directory


def _logits(model: Any, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        out = model(ids)
    return out[0] if isinstance(out, tuple) else out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64,
                                   torch.float16])
def test_unpack_gives_the_dequantized_values_for_every_byte_and_scale(dtype: torch.dtype
                                                                     ) -> None:
    """Every byte (two codes) under every scale byte but NaN's and the two that overflow:
    bit for bit `dequantize`'s values, or in float16 those rounded once."""
    scales = torch.arange(NAN_SCALE - 2, dtype=torch.uint8).repeat_interleave(16)  # (253*16,)
    blocks = torch.arange(256, dtype=torch.uint8).repeat(scales.numel() // 16 + 1)
    blocks = blocks[:scales.numel() * BLOCK_BYTES].view(-1, 1, BLOCK_BYTES)  # (n, 1, 16)
    scales = scales.view(-1, 1)  # (n, 1)
    exact = dequantize(blocks, scales, torch.float32)  # (n, 32)
    for scratch in (False, True):
        got = unpack(blocks, scales, dtype, scratch=scratch)
        assert got.dtype == dtype
        assert torch.equal(got, exact.to(dtype))
        assert torch.equal(got.signbit(), exact.to(dtype).signbit())  # -0.0 kept


def test_scratch_memory_is_kept_per_thread_and_size() -> None:
    """`unpack(scratch=True)` writes into this thread's memory for its size (the next call
    overwrites it); another thread, or another size, has its own."""
    import threading

    g = torch.Generator().manual_seed(0)
    blocks = torch.randint(0, 256, (8, 2, BLOCK_BYTES), generator=g, dtype=torch.uint8)
    scales = torch.randint(120, 130, (8, 2), generator=g, dtype=torch.uint8)
    first = unpack(blocks, scales, torch.bfloat16, scratch=True)
    again = unpack(blocks.flip(0), scales.flip(0), torch.bfloat16, scratch=True)
    assert first.data_ptr() == again.data_ptr()  # kept, overwritten
    assert torch.equal(first, unpack(blocks, scales, torch.bfloat16).flip(0))
    other: list[int] = []
    thread = threading.Thread(target=lambda: other.append(
        unpack(blocks, scales, torch.bfloat16, scratch=True).data_ptr()))
    thread.start()
    thread.join()
    assert other and other[0] != first.data_ptr()
    assert unpack(blocks[:4], scales[:4], torch.bfloat16, scratch=True).data_ptr() != (
        first.data_ptr())


@settings(max_examples=25, deadline=None)
@given(out=st.integers(1, 9), groups=st.integers(1, 3), bias=st.booleans(),
       rows=st.integers(1, 5), seed=st.integers(0, 2**16))
def test_a_packed_layer_is_the_linear_of_its_dequantized_weight(
        out: int, groups: int, bias: bool, rows: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    layer = Mxfp4Linear(32 * groups, out, bias=bias)
    layer.blocks.copy_(torch.randint(0, 256, layer.blocks.shape, generator=g))
    layer.scales.copy_(torch.randint(110, 130, layer.scales.shape, generator=g))
    if layer.bias is not None:
        layer.bias.data.normal_(generator=g)
    w = dequantize(layer.blocks, layer.scales, torch.float64)  # (out, in)
    x = torch.randn(rows, 32 * groups, generator=g, dtype=torch.float64)
    layer = layer.double()
    want = x @ w.T + (0 if layer.bias is None else layer.bias)
    torch.testing.assert_close(layer(x), want, rtol=0, atol=1e-12)
    # through autograd: the input's and the bias's gradients, and no weight kept for them
    seen = []
    x.requires_grad_()
    with torch.autograd.graph.saved_tensors_hooks(lambda t: seen.append(t) or t, lambda t: t):
        got = layer(x)
    assert all(t.dtype == torch.uint8 for t in seen)  # the packed bytes alone
    up = torch.randn(got.shape, generator=g, dtype=torch.float64)
    (grad,) = torch.autograd.grad((got * up).sum(), x, retain_graph=True)
    torch.testing.assert_close(grad, up @ w, rtol=0, atol=1e-12)
    if layer.bias is not None:
        (grad_bias,) = torch.autograd.grad((got * up).sum(), layer.bias)
        torch.testing.assert_close(grad_bias, up.sum(0), rtol=0, atol=1e-12)


@pytest.mark.parametrize("out, n_in", [(1024, 1024), (2048, 1024), (1024, 2048)])
def test_a_packed_layer_sums_as_the_dequantized_models_layer(out: int, n_in: int) -> None:
    """float32: bit for bit the Linear `GPT.lay_out_weights` lays out, one row (where a
    CPU's matrix-vector product sums in another order over the other memory) or many; in
    bfloat16, where the packed layer skips that copy, within one rounding (equal on the AMD
    EPYC measured)."""
    g = torch.Generator().manual_seed(out + n_in)
    packed = Mxfp4Linear(n_in, out)
    packed.blocks.copy_(torch.randint(0, 256, packed.blocks.shape, generator=g))
    packed.scales.copy_(torch.randint(118, 122, packed.scales.shape, generator=g))
    packed.bias.data.normal_(generator=g)
    for dtype in (torch.float32, torch.bfloat16):
        layer = packed.to(dtype)
        linear = Linear(n_in, out).to(dtype)
        w = unpack(layer.blocks, layer.scales, dtype)  # (out, in)
        linear.weight.data = w.t().contiguous().t() if out >= n_in else w  # GPT's layout
        linear.bias.data = layer.bias.data.clone()
        assert laid_out(linear)
        for rows in (1, 4, 64):
            x = torch.randn(rows, n_in, generator=g).to(dtype)
            with torch.no_grad():
                want, got = linear(x), layer(x)
            if dtype == torch.float32:
                assert torch.equal(got, want)
            torch.testing.assert_close(got, want, rtol=2**-8, atol=0)


def test_packed_experts_compute_the_dequantized_model(pair: tuple[Any, Path]) -> None:
    """float32 bit for bit, forward and greedy generation; bfloat16 within a rounding."""
    _, directory = pair
    ids = random_ids(2, 11)
    for dtype in (torch.float32, torch.bfloat16):
        dequantized = load_hf(directory, dtype=dtype, packed=False)
        packed = load_hf(directory, dtype=dtype, packed=True)
        assert not packed_layers(dequantized)
        assert len(packed_layers(packed)) == 2 * 4 * 3  # layers x experts x (gate, up, down)
        assert packed.num_params(False) == dequantized.num_params(False)
        if dtype == torch.float32:
            assert torch.equal(_logits(packed, ids), _logits(dequantized, ids))
            prompt = ids[:1, :5]
            assert torch.equal(generate(packed, prompt, max_new_tokens=6, temperature=0),
                               generate(dequantized, prompt, max_new_tokens=6, temperature=0))
        torch.testing.assert_close(_logits(packed, ids), _logits(dequantized, ids),
                                   rtol=2**-7, atol=2**-7)
        expert = packed.blocks[1].mlp.experts[3]
        assert torch.equal(expert.gate.weight_in(dtype),
                           dequantized.blocks[1].mlp.experts[3].gate.weight)
    float_bytes = sum(p.numel() * p.element_size() for p in packed.parameters())
    packed_bytes = sum(m.blocks.nbytes + m.scales.nbytes for m in packed_layers(packed))
    expert_weights = sum(m.in_features * m.out_features for m in packed_layers(packed))
    assert packed_bytes * 32 == expert_weights * 17  # 4.25 bits a weight
    assert float_bytes + packed_bytes < sum(
        p.numel() * p.element_size() for p in dequantized.parameters())


def test_packed_experts_pass_gradients_as_the_dequantized_ones_do(
        pair: tuple[Any, Path]) -> None:
    """Under autograd (a notebook's forward without no_grad, gradient attribution): the
    same logits, within float32's rounding (the products may run another kernel), and the
    same gradients at the token embeddings and the experts' biases."""
    _, directory = pair
    ids = random_ids(2, 9)
    grads = []
    for packed in (False, True):
        model = load_hf(directory, packed=packed)
        logits = model(ids)
        logits = logits[0] if isinstance(logits, tuple) else logits
        (logits.float() ** 2).mean().backward()
        bias = model.blocks[1].mlp.experts[2].proj.bias
        grads.append((logits.detach(), model.wte.weight.grad, bias.grad))
    for dequantized, packed_ in zip(*grads, strict=True):
        torch.testing.assert_close(packed_, dequantized, rtol=1e-5, atol=1e-6)


def test_the_fit_check_packs_the_experts_only_where_dequantized_they_do_not_fit(
        pair: tuple[Any, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    _, directory = pair
    info = inspect_dir(directory)
    report = info.memory("cpu")
    full, small = report["float32"]["bytes"], report["float32 + MXFP4 experts"]["bytes"]
    assert small < full
    assert not packed_layers(load_hf(directory))  # room: dequantized
    monkeypatch.setattr(memory, "available_bytes", lambda device: small)
    assert len(packed_layers(load_hf(directory))) == 24
    with pytest.raises(memory.DoesNotFitError):
        load_hf(directory, packed=False)
    monkeypatch.setattr(memory, "available_bytes", lambda device: small - 1)
    with pytest.raises(memory.DoesNotFitError, match="packed as MXFP4"):
        load_hf(directory)


def test_a_command_says_when_it_keeps_the_experts_packed(
        pair: tuple[Any, Path], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    _, directory = pair
    argv = ["generate", str(directory), "hat", "--max_new_tokens", "5", "--seed", "3"]
    assert main(argv) == 0
    roomy = capsys.readouterr()
    report = inspect_dir(directory).memory("cpu")
    between = (report["float32 + MXFP4 experts"]["bytes"] + report["float32"]["bytes"]) // 2
    monkeypatch.setattr(memory, "available_bytes", lambda device: between)
    assert main(argv) == 0
    tight = capsys.readouterr()
    assert "packed as MXFP4" not in roomy.err and "24 expert matrices stay packed" in tight.err
    assert tight.out == roomy.out  # the same logits, so the same draws


def test_packed_bytes_are_refused_where_float_weights_are_needed(
        pair: tuple[Any, Path], tmp_path: Path) -> None:
    _, directory = pair
    model = load_hf(directory, packed=True)
    with pytest.raises(ValueError, match="save_hf: this model holds 24 matrices packed as MXFP4"):
        save_hf(tmp_path / "out", model)
    with pytest.raises(ValueError, match=r"save_checkpoint: .*packed=False"):
        save_checkpoint(tmp_path / "ckpt", model, make_tokenizer())
    assert not (tmp_path / "out").exists() and not (tmp_path / "ckpt").exists()
    tokenizer = make_tokenizer()
    dataset = TextDataset("t", tokenizer, np.arange(400) % tokenizer.vocab_size,
                          np.arange(100) % tokenizer.vocab_size)
    with pytest.raises(ValueError, match=r"init \(fine-tuning\): this model holds 24"):
        train(model.config, TrainConfig(max_iters=1, device="cpu"), dataset, tmp_path / "run",
              init=Checkpoint(model, tokenizer, {}, directory))
    plain = Path(__file__).resolve().parents[1] / "data" / "v0.2_hf_llama"
    with pytest.raises(ValueError, match="packed=True: these weights have no packed form"):
        load_hf(plain, packed=True)


@pytest.mark.parametrize("scale, code, message", [
    (NAN_SCALE, 0x11, "scale byte 255"), (254, 0x44, "beyond float32"),
    (253, 0x77, "beyond float32")])
def test_a_damaged_block_is_refused_on_load_naming_its_expert(
        pair: tuple[Any, Path], tmp_path: Path, scale: int, code: int, message: str) -> None:
    """Checked once, on load: scale 255 (E8M0's NaN) or a value past float32's range."""
    from safetensors.torch import load_file, save_file

    _, directory = pair
    damaged = tmp_path / "damaged"
    shutil.copytree(directory, damaged)
    state = load_file(str(damaged / "model.safetensors"))
    name = "model.layers.1.mlp.experts.down_proj"
    state[f"{name}_scales"][2, 5, 0] = scale
    state[f"{name}_blocks"][2, 5, 0, :] = code
    save_file(state, str(damaged / "model.safetensors"))
    with pytest.raises(ValueError, match=rf"blocks\.1\.mlp\.experts\.2\.proj: .*{message}"):
        load_hf(damaged, packed=True)
    with pytest.raises(ValueError, match=message):
        load_hf(damaged, packed=False)
