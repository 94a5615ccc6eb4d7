"""The summary kernels and the 3xTF32 product compiled for an H100 (sm_90) on any machine, no
GPU needed: Triton's ahead-of-time compiler builds each cubin and `cuobjdump` from Triton's
NVIDIA tools reads it back. For each summary kernel at its tuned tiles (bfloat16, head size
64, causal) and the product at two tile sizes (float32, as a linear launches it) this prints
the registers and local memory per thread, and per loop of the machine code (the masked and
unmasked walks over blocks) the instructions one warp issues per block, with the
exponentials (MUFU), a reduction's butterfly shuffles (SHFL.BFLY), barriers (BAR) and
tensor-core products (HGMMA) among them.

A warp's MUFU instruction occupies its quarter of the SM for 8 cycles (16 exponentials a
cycle per SM), any other for about one: a loop issuing more instructions than 8x its MUFU
count is bound by issue, not by the exponentials (docs/performance-gpu.md#summaries-on-a-gpu).
Static counts, not timings: a GPU measures those (`benchmarks.gpu_summaries`).

    python -m benchmarks.kernel_sass [--out FILE]
"""

from __future__ import annotations

import argparse
import collections
import inspect
import json
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: the flags of a causal bfloat16 model at head size 64, and every row summary wanted
FLAGS = dict(HS=64, BLOCK_D=64, CAUSAL=True, WINDOWED=False, HAS_PAD=False, IEEE=False)
WANTS = dict(WANT_ENTROPY=True, WANT_SINK=True, WANT_DISTANCE=True, WANT_MAX=True)
OPCODE = re.compile(r"^\s+/\*([0-9a-f]+)\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_]+)(\.[A-Z0-9_.]+)?")


def tools() -> tuple[Any, Path]:
    """triton and its cuobjdump; ImportError with the fix where either is missing."""
    try:
        import triton
        from triton.backends.compiler import GPUTarget  # noqa: F401
        from triton.compiler import ASTSource
    except ImportError as err:
        raise ImportError(f"needs triton with its ahead-of-time compiler ({err}): "
                          "pip install triton") from err
    if "constexprs" not in inspect.signature(ASTSource).parameters:  # an older triton
        raise ImportError(f"triton {triton.__version__}'s ASTSource takes no constexprs: "
                          "pip install --upgrade triton")
    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not cuobjdump.exists():
        raise ImportError(f"no {cuobjdump}: triton without its NVIDIA tools")
    return triton, cuobjdump


def _compile_for_h100(kernel: Any, constants: dict[str, Any], type_of: Callable[[str], str],
                      unaligned: tuple[str, ...], options: dict[str, int]) -> Any:
    """kernel for sm_90, specialised as the JIT specialises a launch: its constexprs and the
    parameters in `constants` fixed, the others typed by `type_of(name)`, and those not in
    `unaligned` (pointers 16-byte aligned, strides and lengths) multiples of 16."""
    triton, _ = tools()
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature, aligned = {}, {}
    for index, param in enumerate(kernel.params):
        if param.is_constexpr or param.name in constants:
            signature[param.name] = "constexpr"
            continue
        signature[param.name] = type_of(param.name)
        if param.name not in unaligned:
            aligned[(index,)] = [["tt.divisibility", 16]]
    source = ASTSource(fn=kernel, signature=signature, constexprs=constants, attrs=aligned)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)


def compile_for_h100(kernel: Any, tuned: tuple[int, ...], **constants: Any) -> Any:
    """kernel (a summary_triton kernel) for sm_90 with bfloat16 q, k and v at the tuned
    (rows, keys, warps[, stages]), specialised as the JIT specialises a model's launch:
    16-byte aligned pointers, and strides and lengths that are multiples of 16."""
    block_m, block_n, warps, *stages = tuned
    constants = {**FLAGS, "BLOCK_M": block_m, "BLOCK_N": block_n, **constants}
    options = {"num_warps": warps, **({"num_stages": stages[0]} if stages else {})}
    return _compile_for_h100(kernel, constants, _type, ("group", "scale2"), options)


def compile_matmul_for_h100(config: tuple[int, ...], **constants: Any) -> Any:
    """attnlab's 3xTF32 product (`tf32x3_triton.matmul_kernel`) for sm_90 at config
    (`CONFIGS`'s form), by default as most of a model's linears launch it: x (M, K)
    row-major and the weight over (in, out) memory (`GPT.lay_out_weights`), so b =
    weight.t() is (K, N) row-major (the unit strides, which the JIT makes constants), K a
    multiple of BLOCK_K, a bias, pointers, lengths and other strides multiples of 16.
    constants: what differs (a trace's causal scores read k^T along K, with MASK_PAST)."""
    from attnlab.model.tf32x3_triton import matmul_kernel

    block_m, block_n, block_k, warps, stages = config
    unit = {"stride_bn": 1} if "stride_bk" not in constants else {}
    constants = {"HAS_BIAS": True, "EVEN_K": True, "MASK_PAST": False, "ZERO_PAST": False,
                 "BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": block_k, "stride_ak": 1,
                 **unit, **constants}

    def type_of(name: str) -> str:
        return "*fp32" if name.endswith("_ptr") else "fp32" if name == "alpha" else "i32"

    return _compile_for_h100(matmul_kernel, constants, type_of, ("alpha", "diagonal"),
                             {"num_warps": warps, "num_stages": stages})


def _type(name: str) -> str:
    """A summary kernel's parameter's type."""
    if name in ("q_ptr", "k_ptr", "v_ptr", "context_ptr"):
        return "*bf16"
    if name.endswith("_ptr"):
        return {"pad_ptr": "*u8", "first_ptr": "*i32", "clean_ptr": "*i32"}.get(name, "*fp32")
    return "fp32" if name == "scale2" else "i32"


def _dump(compiled: Any, flag: str) -> str:
    _, cuobjdump = tools()
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "kernel.cubin"
        cubin.write_bytes(compiled.asm["cubin"])
        return subprocess.run([str(cuobjdump), flag, str(cubin)], capture_output=True,
                              text=True, check=True).stdout


def usage(compiled: Any) -> dict[str, int]:
    """Registers and local-memory bytes (STACK, LOCAL) per thread of the cubin."""
    dump = _dump(compiled, "--dump-resource-usage")
    return {key: int(value) for key, value in re.findall(r"(REG|STACK|LOCAL):(\d+)", dump)}


def loops(compiled: Any) -> list[dict[str, int]]:
    """Per loop of the machine code (a backward branch and its body): the instructions one
    warp issues per trip, and its MUFU, SHFL.BFLY and BAR among them."""
    code = [(int(m[1], 16), m[2] + (m[3] or ""), line)
            for line in _dump(compiled, "-sass").splitlines() if (m := OPCODE.match(line))]
    found = []
    for address, opcode, line in code:
        target = re.search(r"0x([0-9a-f]+)", line.split(opcode, 1)[1])
        if opcode == "BRA" and target and int(target[1], 16) < address:
            ops = [op for at, op, _ in code if int(target[1], 16) <= at <= address]
            body = collections.Counter(op.split(".")[0] for op in ops)
            found.append({"instructions": len(ops), "MUFU": body["MUFU"],
                          # butterfly shuffles are a reduction's; others broadcast a value
                          "SHFL.BFLY": sum(op.startswith("SHFL.BFLY") for op in ops),
                          "BAR": body["BAR"], "HGMMA": body["HGMMA"]})
    return found


def kernels() -> dict[str, Any]:
    """Each kernel compiled at its tuned tiles for 16-bit heads up to 128."""
    from attnlab.model import summary_kernels, summary_triton, tf32x3_triton

    rows, received = summary_kernels.ROWS_BLOCKS[128], summary_kernels.RECEIVED_BLOCKS[128]
    return {
        "rows pass": compile_for_h100(summary_triton.rows_kernel, rows, **WANTS,
                                      CONTEXT=False),
        "rows pass with the context": compile_for_h100(summary_triton.rows_kernel, rows,
                                                       **WANTS, CONTEXT=True),
        "received pass": compile_for_h100(summary_triton.received_kernel, received),
        "given-lse rows pass": compile_for_h100(summary_triton.given_rows_kernel, rows,
                                                **WANTS),
        # a padded batch: masked loops for blocks that may hold a pad, the unmasked ones
        # for a left padding's real keys
        "rows pass, padded": compile_for_h100(summary_triton.rows_kernel, rows, **WANTS,
                                              CONTEXT=False, HAS_PAD=True),
        "received pass, padded": compile_for_h100(summary_triton.received_kernel, received,
                                                  HAS_PAD=True),
        # the 3xTF32 product (float32 linears, scores, context) at its largest and smallest
        # tiles: the loop's tensor-core products (HGMMA) are three for each one of TF32's
        **{f"3xTF32 product, {c[0]}x{c[1]} tiles": compile_matmul_for_h100(c)
           for c in (tf32x3_triton.CONFIGS[0], tf32x3_triton.CONFIGS[-1])},
        # a trace's products under a plain causal mask: the scores (k^T read along K, -inf
        # past the diagonal) and the context (weights read up to it)
        "3xTF32 causal scores": compile_matmul_for_h100(
            tf32x3_triton.CONFIGS[0], HAS_BIAS=False, MASK_PAST=True, stride_bk=1),
        "3xTF32 causal context": compile_matmul_for_h100(
            tf32x3_triton.CONFIGS[-1], HAS_BIAS=False, ZERO_PAST=True),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.kernel_sass")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    result = {name: {"usage": usage(compiled), "loops": loops(compiled)}
              for name, compiled in kernels().items()}
    for name, found in result.items():
        print(f"{name}: {found['usage']}")
        for loop in found["loops"]:
            if not loop["MUFU"]:  # a product's loop: its tensor-core products are its work
                print(f"  loop: {loop}")
                continue
            bound = "issue" if loop["instructions"] > 8 * loop["MUFU"] else "exponentials"
            print(f"  loop: {loop} (bound by {bound})")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
