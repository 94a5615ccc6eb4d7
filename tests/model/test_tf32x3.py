"""model/tf32x3.py: float32 products as three TF32 products, and where they run.

On a CPU the kernel runs under Triton's interpreter (`helpers.interpreted`), which multiplies
in float32: these tests check its indexing (strides, ragged tiles, the batch, alpha, bias)
and where attnlab calls it, not TF32's error. The `cuda` tests compile it and hold its error
to float32's: the products against float64, a model's logits and a trace's weights."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import helpers
from attnlab import GPT, GPTConfig, Trace
from attnlab.model import tf32x3, traced_attention

if importlib.util.find_spec("triton") is None:  # found, not imported: see `kernels`
    pytest.skip("needs triton (pip install triton)", allow_module_level=True)

KERNELS = "attnlab.model.tf32x3_triton"


@pytest.fixture
def kernels(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The kernel's module under Triton's interpreter, the products on: CPU tensors run it."""
    with helpers.interpreted(monkeypatch, KERNELS) as module:
        monkeypatch.setattr(tf32x3, "ENABLED", True)
        monkeypatch.setattr(tf32x3, "DEVICES", {"cpu", "cuda"})
        yield module


def _operands(case: str) -> tuple[torch.Tensor, torch.Tensor]:
    """a (batch, M, K) and b (batch, K, N) laid out as `case` says."""
    g = torch.Generator().manual_seed(0)
    batch, M, K, N = (3, 70, 40, 33) if case != "one tile" else (1, 16, 32, 16)
    a = torch.randn(batch, M, K, generator=g)
    b = torch.randn(batch, K, N, generator=g)
    if case == "b transposed":  # a linear's weight (N, K) read as (K, N)
        b = torch.randn(batch, N, K, generator=g).transpose(1, 2)
    elif case == "a transposed":
        a = torch.randn(batch, K, M, generator=g).transpose(1, 2)
    elif case == "b shared":  # batch stride 0
        b = torch.randn(1, K, N, generator=g).expand(batch, K, N)
    elif case == "a sliced":  # rows and inner dims of a larger tensor
        a = torch.randn(batch, M + 5, K + 7, generator=g)[:, 5:, 3:3 + K]
    return a, b


@pytest.mark.parametrize("case", ["contiguous", "b transposed", "a transposed", "b shared",
                                  "a sliced", "one tile"])
def test_the_kernel_equals_the_float64_product(case: str, kernels: Any) -> None:
    """Every tile size, with and without bias and alpha: as close to float64 as torch's
    float32 product (K = 40 is not a multiple of the 32-deep step; M, N not of the tiles)."""
    a, b = _operands(case)
    bias = torch.randn(b.shape[2], generator=torch.Generator().manual_seed(1))
    exact = 0.125 * (a.double() @ b.double()) + bias.double()
    for config in kernels.CONFIGS:
        out = kernels.matmul(a, b, 0.125, bias, config)
        assert out.is_contiguous() and out.shape == exact.shape
        assert _error(out, exact) <= 4 * _error(0.125 * (a @ b) + bias, exact) + 1e-6, config
    exact = a.double() @ b.double()  # tiles' choice, alpha 1, no bias
    assert _error(kernels.matmul(a, b), exact) <= 4 * _error(a @ b, exact) + 1e-6


def _error(out: torch.Tensor, exact: torch.Tensor) -> float:
    return (out.double() - exact).abs().max().item()


def test_the_kernel_refuses_mismatched_operands(kernels: Any) -> None:
    a = torch.randn(2, 8, 4)
    with pytest.raises(ValueError, match=r"needs float32 \(batch, M, K\)"):
        kernels.matmul(a, torch.randn(2, 5, 3))
    with pytest.raises(ValueError, match="needs float32"):
        kernels.matmul(a.double(), torch.randn(2, 4, 3).double())


def test_tiles_give_every_multiprocessor_a_tile() -> None:
    """GPT-2 small's products at 1024 tokens on an H100's 132 multiprocessors."""
    from attnlab.model.tf32x3_triton import tiles

    assert tiles(1, 1024, 2304, 132)[:2] == (128, 128)  # q, k, v: 144 tiles
    assert tiles(1, 1024, 768, 132)[:2] == (64, 64)  # out projections: 48, 96, 96, then 192
    assert tiles(12, 1024, 1024, 132)[:2] == (128, 128)  # scores
    assert tiles(12, 1024, 64, 132)[:2] == (64, 64)  # context: no tile wider than the head
    assert tiles(1, 8, 8, 132)[:2] == (64, 64)  # too small for any: the smallest


def _model() -> GPT:
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=65, block_size=96, n_layer=2, n_head=2, n_embd=32)
    return GPT(config).eval()


def _counted(monkeypatch: pytest.MonkeyPatch, kernels: Any) -> list[tuple[int | None, ...]]:
    """The kernel's calls, by their (batch, M, N, causal diagonal or None)."""
    calls: list[tuple[int | None, ...]] = []
    matmul = kernels.matmul

    def counted(a: torch.Tensor, b: torch.Tensor, *args: Any, **kw: Any) -> torch.Tensor:
        calls.append((a.shape[0], a.shape[1], b.shape[2], kw.get("diagonal")))
        return matmul(a, b, *args, **kw)

    monkeypatch.setattr(kernels, "matmul", counted)
    return calls


def test_a_model_and_its_trace_take_the_kernel(kernels: Any,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """With the products on, every linear of a forward and a trace's scores and context run
    the kernel (counted), and the logits and weights equal torch's within float32's error;
    under autograd, with torch's "high" precision, or with fewer than MIN_ROWS rows, none."""
    model, ids = _model(), torch.randint(0, 65, (1, 80), generator=torch.Generator())
    calls = _counted(monkeypatch, kernels)
    with torch.no_grad():
        logits = model(ids)[0]
        weights = Trace(names="attn_weights").run(model, ids).get("attn_weights", 1)
    layer = [(1, 80, 32, None)] * 4 + [(1, 80, 128, None), (1, 80, 32, None)]  # q, k, v, out;
    # fc, proj; (B * nh) scores and contexts, both causal in the product
    attention = [(2, 80, 80, 0), (2, 80, 16, 0)]
    # the forward and its head, then the trace: it stops at the last layer's weights
    assert calls == [*layer, *layer, (1, 80, 65, None),
                     *layer[:3], *attention, *layer[3:], *layer[:3], attention[0]]
    monkeypatch.setattr(tf32x3, "ENABLED", False)
    with torch.no_grad():
        assert torch.allclose(model(ids)[0], logits, atol=1e-5, rtol=1e-5)
        expected = Trace(names="attn_weights").run(model, ids).get("attn_weights", 1)
    assert (weights - expected).abs().max() < 1e-6
    monkeypatch.setattr(tf32x3, "ENABLED", True)
    calls.clear()
    model(ids)  # autograd on
    with torch.no_grad():
        model(ids[:, :tf32x3.MIN_ROWS - 1])
        before = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision("high")
        try:
            model(ids)
        finally:
            torch.set_float32_matmul_precision(before)
    assert calls == []


@pytest.mark.parametrize("diagonal", [0, 1, 3, 40, -2, -5])  # 1, -5: on tiles' edges
def test_the_causal_product_is_the_masked_product(diagonal: int, kernels: Any) -> None:
    """-inf exactly where column c > row r + diagonal, the product's values elsewhere, at
    every tile size (tiles wholly past the diagonal are skipped, not computed)."""
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(2, 70, 16, generator=g), torch.randn(2, 16, 90, generator=g)
    hidden = torch.ones(70, 90, dtype=torch.bool).triu(diagonal + 1)  # (M, N)
    expected = (0.25 * a @ b).masked_fill(hidden, float("-inf"))
    for config in kernels.CONFIGS:
        out = kernels.matmul(a, b, 0.25, None, config, diagonal)
        assert torch.equal(out.isinf(), hidden.expand_as(out))
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("diagonal", [0, 1, 3, 40, -2, -5])  # 1, -5: on tiles' edges
def test_the_causal_context_reads_no_weight_past_the_diagonal(diagonal: int,
                                                              kernels: Any) -> None:
    """Causal weights (0 past each row's diagonal) @ v: the full product's values at every
    tile size, K = 170 not a multiple of 32; ones put past the 32-deep step that holds the
    last row's diagonal change nothing (no tile reads there)."""
    g = torch.Generator().manual_seed(5)
    weights = torch.rand(2, 70, 170, generator=g).tril(diagonal)  # (batch, M, K)
    v = torch.randn(2, 170, 24, generator=g)
    expected = weights.double() @ v.double()
    past = weights.clone()
    past[..., -(-(70 + diagonal) // 32) * 32:] = 1.0  # unread: past every row's last step
    for config in kernels.CONFIGS:
        out = kernels.matmul(past, v, 1.0, None, config, diagonal, "zero")
        assert _error(out, expected) <= 4 * _error(weights @ v, expected) + 1e-6, config
    with pytest.raises(ValueError, match="past='one'"):
        kernels.matmul(weights, v, diagonal=0, past="one")


def test_only_a_plain_causal_mask_goes_into_the_product(kernels: Any,
                                                         monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    """Cached keys (64 new queries over 94 keys) put the causal mask into the scores' and
    the context's products (diagonal 30); a padded batch keeps the mask's own -inf fill and
    the whole context product. Both traces' weights equal torch's."""
    model = GPT(GPTConfig(vocab_size=65, block_size=128, n_layer=1, n_head=2,
                          n_embd=32)).eval()
    ids = torch.randint(0, 65, (2, 94), generator=torch.Generator().manual_seed(4))
    mask = torch.ones(2, 94, dtype=torch.long)
    mask[0, :9] = 0  # left padding

    def weights(diagonals: list[int | None]) -> list[torch.Tensor]:
        calls = _counted(monkeypatch, kernels)
        with torch.no_grad():
            cache = model.new_cache(2, 94)
            model(ids[:, :30], kv_cache=cache)
            cached = Trace(names="attn_weights")
            model(ids[:, 30:], kv_cache=cache, trace=cached)
            padded = Trace(names="attn_weights").run(model, ids, attention_mask=mask)
        assert [call[3] for call in calls if call[2] in (94, 16)] == diagonals  # attention
        return [cached.get("attn_weights", 0), padded.get("attn_weights", 0)]

    # cached: the scores and the context; padded: the scores (the run stops at the weights)
    got = weights([30, 30, None])
    monkeypatch.setattr(tf32x3, "ENABLED", False)
    for mine, theirs in zip(got, weights([]), strict=True):
        torch.testing.assert_close(mine, theirs, atol=1e-6, rtol=0)


def test_the_linear_equals_f_linear_of_any_leading_dims(kernels: Any) -> None:
    """tf32x3.linear over (B, T, K) and (K,)-less bias: F.linear's values and shape."""
    g = torch.Generator().manual_seed(2)
    x, w = torch.randn(2, 40, 24, generator=g), torch.randn(36, 24, generator=g)
    for bias in (None, torch.randn(36, generator=g)):
        out = tf32x3.linear(x, w, bias)
        assert out.shape == (2, 40, 36)
        assert torch.allclose(out, F.linear(x, w, bias), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="leading dims differ"):
        tf32x3.matmul(torch.randn(2, 8, 4), torch.randn(3, 4, 5))


# ----------------------------------------------------------------------------- on a GPU


@pytest.mark.cuda
def test_cuda_products_are_as_close_as_float32(cuda_device: torch.device,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Compiled: GPT-2 small's block products at 1024 tokens and a trace's two products,
    within 4x cuBLAS's float32 error of float64 (one TF32 product is ~1000x off)."""
    if cuda_device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("a CPU dry run calls the kernel only under TRITON_INTERPRET=1")
    from attnlab.model import tf32x3_triton

    g = torch.Generator(cuda_device).manual_seed(0)
    shapes = [(1, 1024, 768, 2304), (1, 1024, 3072, 768), (12, 1024, 64, 1024),
              (12, 1024, 1024, 64)]
    for batch, M, K, N in shapes:
        a = torch.randn(batch, M, K, device=cuda_device, generator=g)
        b = torch.randn(batch, K, N, device=cuda_device, generator=g) * 0.02
        exact = a.double() @ b.double()
        cublas = (torch.bmm(a, b).double() - exact).abs().max().item()
        ours = (tf32x3_triton.matmul(a, b).double() - exact).abs().max().item()
        assert ours <= 4 * cublas, (batch, M, K, N, ours, cublas)


@pytest.mark.cuda
def test_cuda_trace_with_the_products_keeps_the_weights(cuda_device: torch.device,
                                                        monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    """A float32 GPT-2-shaped model (initializer 0.02) on the GPU: logits and every layer's
    weights with the products on equal cuBLAS's within 1e-5."""
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=512, block_size=512, n_layer=4, n_head=12, n_embd=768,
                       gelu="tanh")
    model = GPT(config).to(cuda_device).eval()
    ids = torch.randint(0, 512, (2, 512), device=cuda_device)

    def run() -> tuple[torch.Tensor, list[torch.Tensor]]:
        with torch.inference_mode():
            trace = Trace(names="attn_weights").run(model, ids)
            return model(ids)[0], [trace.get("attn_weights", i) for i in range(4)]

    logits, weights = run()
    # a CPU dry run (tests/conftest.py) runs the kernel only under Triton's interpreter
    kernel = cuda_device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"
    monkeypatch.setattr(tf32x3, "ENABLED", True)
    monkeypatch.setattr(tf32x3, "DEVICES", {cuda_device.type} if kernel else set())
    from attnlab.model import tf32x3_triton

    calls = _counted(monkeypatch, tf32x3_triton)
    logits3, weights3 = run()
    # the trace: 6 linears and each block's scores and context a layer, less the last
    # layer's 3 linears and contexts after its weights; then the forward's and its head
    blocks = 1 if cuda_device.type == "cuda" else 512 // traced_attention.BLOCK_ROWS
    assert len(calls) == (4 * (6 + 2 * blocks) - 3 - blocks + 4 * 6 + 1 if kernel else 0)
    assert (logits3 - logits).abs().max() < 1e-4 * logits.abs().max()
    assert max((w3 - w).abs().max().item() for w3, w in zip(weights3, weights, strict=True)) < 1e-5
