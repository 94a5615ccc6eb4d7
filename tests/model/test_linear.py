"""layers.Linear: oneDNN's float32 kernel where runtime.linear_kernel() picks it, F.linear
everywhere else (autograd, autocast, small products), and the same model either way."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from attnlab.model import runtime
from attnlab.model.config import GPTConfig
from attnlab.model.gpt import GPT
from attnlab.model.layers import Linear
from attnlab.model.trace import Trace

needs_onednn = pytest.mark.skipif(not torch.backends.mkldnn.is_available(),
                                  reason="this PyTorch build has no oneDNN")


@pytest.fixture
def kernel(request: pytest.FixtureRequest) -> Iterator[str]:
    before = runtime.linear_kernel()
    yield runtime.set_linear_kernel(request.param)
    runtime.set_linear_kernel(before)


class _Ops(TorchDispatchMode):
    """Names of the ops run inside it."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.names.append(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))


def _ops(fn: Any) -> list[str]:
    with _Ops() as ops:
        fn()
    return ops.names


ROWS = runtime.ONEDNN_MIN_MACS // (64 * 64)  # a (1, ROWS, 64) input of Linear(64, 64): at it


@needs_onednn
@pytest.mark.parametrize("kernel", ["onednn"], indirect=True)
def test_onednn_runs_inference_products_at_the_threshold_only(kernel: str) -> None:
    torch.manual_seed(0)
    lin = Linear(64, 64)
    x = torch.randn(1, ROWS, 64)
    with torch.no_grad():
        assert "mkldnn._linear_pointwise" in _ops(lambda: lin(x))
        assert "mkldnn._linear_pointwise" not in _ops(lambda: lin(x[:, 1:]))  # below it
        torch.testing.assert_close(lin(x), F.linear(x, lin.weight, lin.bias),
                                   rtol=1e-5, atol=1e-5)
    with torch.inference_mode():
        assert "mkldnn._linear_pointwise" in _ops(lambda: lin(x))
    # autograd: oneDNN's op has no backward, so F.linear runs and gradients flow
    assert "mkldnn._linear_pointwise" not in _ops(lambda: lin(x).sum().backward())
    assert lin.weight.grad is not None
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert lin(x).dtype == torch.bfloat16  # autocast's F.linear, not float32 oneDNN
    with torch.no_grad():
        # a weight that is not one dense matrix (a column slice of the head's (in, out)
        # memory): oneDNN's reference kernel took minutes for GPT-2's head, so F.linear
        lin.weight = torch.nn.Parameter(torch.randn(64, 128).t()[:64])  # (64, 64), strided
        assert "mkldnn._linear_pointwise" not in _ops(lambda: lin(x))
        assert "mkldnn._linear_pointwise" not in _ops(lambda: lin.double()(x.double()))


@pytest.mark.parametrize("kernel", ["blas"], indirect=True)
def test_blas_is_f_linear(kernel: str) -> None:
    lin = Linear(64, 64)
    x = torch.randn(1, ROWS, 64)
    with torch.no_grad():
        assert "mkldnn._linear_pointwise" not in _ops(lambda: lin(x))
        assert torch.equal(lin(x), F.linear(x, lin.weight, lin.bias))


def test_choosing_the_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    before = runtime.linear_kernel()
    try:
        with pytest.raises(ValueError, match=r"'mkl'.*\['onednn', 'blas', 'auto'\]"):
            runtime.set_linear_kernel("mkl")
        assert runtime.set_linear_kernel("auto") in runtime.LINEAR_KERNELS
        assert runtime.set_linear_kernel("blas") == runtime.linear_kernel() == "blas"
        monkeypatch.setattr(runtime, "_linear", [])  # not chosen yet: ATTNLAB_LINEAR decides
        monkeypatch.setenv("ATTNLAB_LINEAR", "blas")
        assert runtime.linear_kernel() == "blas"
        monkeypatch.setattr(runtime, "_linear", [])
        monkeypatch.setenv("ATTNLAB_LINEAR", "fast")
        with pytest.raises(ValueError, match=r"'fast' \(ATTNLAB_LINEAR\?\) must be one of"):
            runtime.linear_kernel()
    finally:
        monkeypatch.undo()
        runtime.set_linear_kernel(before)


@pytest.mark.parametrize(("amd", "capability", "expected"), [
    (True, "AVX512", "onednn"), (True, "AVX2", "blas"), (False, "AVX512", "blas")])
@needs_onednn
def test_auto_takes_onednn_only_on_amd_cpus_with_avx512(
    amd: bool, capability: str, expected: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """oneDNN was faster on a Zen 4 EPYC (AVX-512) and 1.4-1.7x slower on a Zen 3 one
    (AVX2) for GPT-2 small's forward and trace (docs/performance.md#linear-kernel)."""
    before = runtime.linear_kernel()
    monkeypatch.setattr(runtime, "_amd_x86", lambda: amd)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    try:
        assert runtime.set_linear_kernel("auto") == runtime.linear_kernel() == expected
    finally:
        monkeypatch.undo()
        runtime.set_linear_kernel(before)


@needs_onednn
def test_one_model_under_both_kernels() -> None:
    """A model big enough for oneDNN (256 x 256 x 256 products) computes the same logits as
    through F.linear, to float32's rounding; the traced forward, Trace.run and a left-padded
    batch agree within a kernel as they do with BLAS."""
    torch.manual_seed(0)
    config = GPTConfig(n_layer=2, n_head=4, n_embd=256, vocab_size=300, block_size=320)
    model = GPT(config).eval()
    ids = torch.randint(0, 300, (1, 256))
    padded = torch.cat([torch.zeros(1, 40, dtype=torch.long), ids], dim=1)  # (1, 296)
    mask = torch.cat([torch.zeros(1, 40), torch.ones(1, 256)], dim=1).long()
    before = runtime.linear_kernel()
    out: dict[str, torch.Tensor] = {}
    try:
        for name in runtime.LINEAR_KERNELS:
            runtime.set_linear_kernel(name)
            with torch.no_grad():
                ran = _ops(lambda: model(ids))
                assert ("mkldnn._linear_pointwise" in ran) == (name == "onednn")
                out[name] = logits = model(ids).logits  # (1, 256, V)
                trace = Trace(names=["attn_weights"])
                model(ids, trace=trace)
                run = Trace(names=["attn_weights"]).run(model, ids)
                assert all(torch.equal(run.values[k], trace.values[k]) for k in trace.values)
                row = model(padded, attention_mask=mask).logits[:, 40:]  # (1, 256, V)
                torch.testing.assert_close(row, logits, rtol=1e-4, atol=1e-4)
    finally:
        runtime.set_linear_kernel(before)
    torch.testing.assert_close(out["onednn"], out["blas"], rtol=1e-5, atol=1e-5)


@needs_onednn
@pytest.mark.parametrize("kernel", ["onednn"], indirect=True)
@pytest.mark.parametrize("gelu", ["tanh", "exact"])
def test_mlp_gelu_runs_in_the_product_unless_a_hook_watches(kernel: str, gelu: str) -> None:
    """The GELU MLP's input projection and GELU are one oneDNN call without autograd; with
    a forward hook on `fc` the hook gets fc's own output and the GELU runs after it."""
    from attnlab.model.layers import GELUS, MLP

    torch.manual_seed(0)
    mlp = MLP(64, 256, gelu=gelu).eval()
    x = torch.randn(1, ROWS, 64)
    approximate = GELUS[gelu]
    with torch.no_grad():
        expected = F.linear(F.gelu(F.linear(x, mlp.fc.weight, mlp.fc.bias),
                                   approximate=approximate), mlp.proj.weight, mlp.proj.bias)
        ran = _ops(lambda: mlp(x))
        assert "aten.gelu" not in ran and ran.count("mkldnn._linear_pointwise") == 2
        torch.testing.assert_close(mlp(x), expected, rtol=1e-5, atol=1e-5)
        seen: list[torch.Tensor] = []
        handle = mlp.fc.register_forward_hook(lambda m, args, out: seen.append(out))
        try:
            assert "aten.gelu" in _ops(lambda: mlp(x))
            torch.testing.assert_close(mlp(x), expected, rtol=1e-5, atol=1e-5)
        finally:
            handle.remove()
        torch.testing.assert_close(seen[-1], F.linear(x, mlp.fc.weight, mlp.fc.bias),
                                   rtol=1e-5, atol=1e-5)  # before the GELU
        assert "aten.gelu" not in _ops(lambda: mlp(x))  # hook gone: fused again


@needs_onednn
@pytest.mark.parametrize("kernel", ["onednn"], indirect=True)
def test_an_exported_graph_gets_aten_linear(kernel: str) -> None:
    """torch.export (and torch.compile) trace F.linear: exporters know aten.linear, and
    compilers pick kernels for it themselves."""
    lin = Linear(64, 64).eval()
    x = torch.randn(1, ROWS, 64)
    with torch.no_grad():
        program = torch.export.export(lin, (x,))
    ops = [str(node.target) for node in program.graph.nodes if node.op == "call_function"]
    assert ops == ["aten.linear.default"]
