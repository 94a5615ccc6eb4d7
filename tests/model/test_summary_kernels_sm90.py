"""model/summary_triton.py compiled for an H100 (sm_90) on a machine with no GPU: Triton's
NVIDIA backend builds the cubin ahead of time and `cuobjdump` reads its resource use. The
summaries' tuned tiles (`summary_kernels.ROWS_BLOCKS`, `RECEIVED_BLOCKS`) must compile, the
rows pass with the context (`attend_and_summarise`) must add its second product and not one
exponential, and none may spill registers to local memory (a spill turns each block's
reductions into memory traffic). The timings are a GPU's: docs/performance.md."""

from __future__ import annotations

import importlib.util
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from attnlab.model import summary_kernels

if importlib.util.find_spec("triton") is None:
    pytest.skip("needs triton (pip install triton)", allow_module_level=True)

import triton

try:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
except ImportError:  # another triton layout: nothing to compile with
    pytest.skip(f"triton {triton.__version__} has no ahead-of-time compiler API",
                allow_module_level=True)

CUOBJDUMP = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
if not CUOBJDUMP.exists():
    pytest.skip("triton without its NVIDIA tools", allow_module_level=True)

from attnlab.model import summary_triton  # noqa: E402

H100 = GPUTarget("cuda", 90, 32)
FLAGS = dict(HS=64, BLOCK_D=64, CAUSAL=True, WINDOWED=False, HAS_PAD=False, IEEE=False)
WANTS = dict(WANT_ENTROPY=True, WANT_SINK=True, WANT_DISTANCE=True, WANT_MAX=True)


def _compile(kernel: Any, tuned: tuple[int, ...], **constants: Any) -> Any:
    """kernel for sm_90 with bfloat16 q, k and v, the tuned (rows, keys, warps[, stages])."""
    block_m, block_n, warps, *stages = tuned
    constants = {**FLAGS, "BLOCK_M": block_m, "BLOCK_N": block_n, **constants}
    signature = {}
    for param in kernel.params:
        name = param.name
        if param.is_constexpr:
            signature[name] = "constexpr"
        elif name in ("q_ptr", "k_ptr", "v_ptr", "context_ptr"):
            signature[name] = "*bf16"
        elif name == "pad_ptr":
            signature[name] = "*u8"
        elif name == "first_ptr":
            signature[name] = "*i32"
        elif name.endswith("_ptr"):
            signature[name] = "*fp32"
        else:
            signature[name] = "fp32" if name == "scale2" else "i32"
    # as the JIT specialises a model's launch: 16-byte aligned pointers, and strides and
    # lengths that are multiples of 16 (a model's, at hs = 64); the head group may be any
    aligned = {(index,): [["tt.divisibility", 16]] for index, param in enumerate(kernel.params)
               if not param.is_constexpr and param.name not in ("group", "scale2")}
    source = ASTSource(fn=kernel, signature=signature, constexprs=constants, attrs=aligned)
    options = {"num_warps": warps, **({"num_stages": stages[0]} if stages else {})}
    return triton.compile(source, target=H100, options=options)


def _usage(compiled: Any, tmp_path: Path) -> dict[str, int]:
    """The cubin's registers and local-memory bytes (STACK, LOCAL) per thread."""
    cubin = tmp_path / "kernel.cubin"
    cubin.write_bytes(compiled.asm["cubin"])
    dump = subprocess.run([str(CUOBJDUMP), "--dump-resource-usage", str(cubin)],
                          capture_output=True, text=True, check=True).stdout
    return {key: int(value) for key, value in re.findall(r"(REG|STACK|LOCAL):(\d+)", dump)}


def _count(compiled: Any, pattern: str) -> int:
    return len(re.findall(pattern, compiled.asm["ptx"]))


@pytest.mark.filterwarnings("ignore:TRITON_DEFAULT_FP_FUSION:UserWarning")
def test_the_rows_pass_compiles_without_spills_with_and_without_the_context(
    tmp_path: Path
) -> None:
    tuned = summary_kernels.ROWS_BLOCKS[128]
    alone = _compile(summary_triton.rows_kernel, tuned, **WANTS, CONTEXT=False)
    both = _compile(summary_triton.rows_kernel, tuned, **WANTS, CONTEXT=True)
    for compiled in (alone, both):
        usage = _usage(compiled, tmp_path)
        assert usage["REG"] <= 255 and usage["STACK"] == 0 and usage["LOCAL"] == 0, usage
    # the context's product over v is one more matrix product per block, and it shares the
    # summaries' exponentials: the same count of ex2 in both
    assert _count(both, r"ex2\.approx") == _count(alone, r"ex2\.approx") > 0
    assert _count(both, r"wgmma\.mma_async") > _count(alone, r"wgmma\.mma_async") > 0


@pytest.mark.filterwarnings("ignore:TRITON_DEFAULT_FP_FUSION:UserWarning")
def test_the_received_pass_compiles_without_spills(tmp_path: Path) -> None:
    compiled = _compile(summary_triton.received_kernel, summary_kernels.RECEIVED_BLOCKS[128])
    usage = _usage(compiled, tmp_path)
    assert usage["REG"] <= 255 and usage["STACK"] == 0 and usage["LOCAL"] == 0, usage
