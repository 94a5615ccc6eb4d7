"""model/summary_triton.py and model/tf32x3_triton.py compiled for an H100 (sm_90) on a
machine with no GPU (`benchmarks.kernel_sass`: Triton's ahead-of-time compiler, its
cuobjdump). The summaries' tuned tiles (`summary_kernels.ROWS_BLOCKS`, `RECEIVED_BLOCKS`)
must compile; no kernel may spill registers to local memory (a spill turns each block's
reductions into memory traffic); the rows pass with the context (`attend_and_summarise`)
adds its second product and not one exponential; the received pass and the given-lse rows
pass sum over rows outside their loops (no reduction's shuffle in them); the 3xTF32 product
makes three TF32 tensor-core products for each of one. The timings are a GPU's:
docs/performance-gpu.md#summaries-on-a-gpu."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from benchmarks import kernel_sass

try:
    kernel_sass.tools()
except ImportError as err:
    pytest.skip(str(err), allow_module_level=True)

pytestmark = pytest.mark.filterwarnings("ignore:TRITON_DEFAULT_FP_FUSION:UserWarning")


@pytest.fixture(scope="module")
def compiled() -> dict[str, Any]:
    return kernel_sass.kernels()


def _count(compiled: Any, pattern: str) -> int:
    return len(re.findall(pattern, compiled.asm["ptx"]))


def test_no_kernel_spills_registers(compiled: dict[str, Any]) -> None:
    for name, kernel in compiled.items():
        usage = kernel_sass.usage(kernel)
        assert usage["REG"] <= 255 and usage["STACK"] == 0 and usage["LOCAL"] == 0, name


def test_the_context_shares_the_rows_pass_exponentials(compiled: dict[str, Any]) -> None:
    alone, both = compiled["rows pass"], compiled["rows pass with the context"]
    assert _count(both, r"ex2\.approx") == _count(alone, r"ex2\.approx") > 0
    assert _count(both, r"wgmma\.mma_async") > _count(alone, r"wgmma\.mma_async") > 0
    assert ([loop["MUFU"] for loop in kernel_sass.loops(both)]
            == [loop["MUFU"] for loop in kernel_sass.loops(alone)])


def test_the_received_pass_sums_over_rows_once(compiled: dict[str, Any]) -> None:
    loops = kernel_sass.loops(compiled["received pass"])
    assert len(loops) >= 2 and all(loop["MUFU"] > 0 for loop in loops), loops
    assert all(loop["SHFL.BFLY"] == 0 for loop in loops), loops


def test_the_given_lse_pass_sums_once_and_issues_less(compiled: dict[str, Any]) -> None:
    """Given the lse, the rows pass's unmasked loop has no running max and no sum per
    block: the same exponentials, no shuffle, fewer instructions per block."""
    given = kernel_sass.loops(compiled["given-lse rows pass"])
    rows = kernel_sass.loops(compiled["rows pass"])
    assert all(loop["SHFL.BFLY"] == 0 for loop in given), given
    assert min(loop["instructions"] for loop in given) < min(
        loop["instructions"] for loop in rows), (given, rows)
    assert {loop["MUFU"] for loop in given} == {32}, given


def test_the_3xtf32_product_makes_three_tensor_core_products(compiled: dict[str, Any]
                                                             ) -> None:
    """The float32 product's one loop issues three TF32 wgmma's for each 8-deep slice of a
    32-deep step, per 64-row warpgroup tile: 12 at both tile sizes, and no exponential."""
    for name in ("product, 128x128 tiles", "product, 64x64 tiles", "causal scores",
                 "causal context"):
        [loop] = kernel_sass.loops(compiled[f"3xTF32 {name}"])
        assert loop["HGMMA"] == 3 * 32 // 8 and loop["MUFU"] == 0, (name, loop)
    assert _count(compiled["3xTF32 product, 64x64 tiles"], r"wgmma\.mma_async\S*\.tf32") > 0


def test_a_padded_batch_keeps_the_unmasked_loops(compiled: dict[str, Any]) -> None:
    """A left padding's blocks of real keys take the loop an unpadded batch takes."""
    for kernel in ("rows pass", "received pass"):
        fewest = min(loop["instructions"] for loop in kernel_sass.loops(compiled[kernel]))
        padded = kernel_sass.loops(compiled[f"{kernel}, padded"])
        assert fewest in [loop["instructions"] for loop in padded], (kernel, padded)


def test_the_report_names_each_kernel(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert kernel_sass.main(["--out", str(tmp_path / "sass.json")]) == 0
    written = json.loads((tmp_path / "sass.json").read_text())
    assert list(written) == ["rows pass", "rows pass with the context", "received pass",
                             "given-lse rows pass", "rows pass, padded",
                             "received pass, padded", "3xTF32 product, 128x128 tiles",
                             "3xTF32 product, 64x64 tiles", "3xTF32 causal scores",
                             "3xTF32 causal context"]
    assert all(found["loops"] and found["usage"]["REG"] > 0 for found in written.values())
    assert "received pass:" in capsys.readouterr().out
