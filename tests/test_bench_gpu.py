"""The GPU suites (benchmarks/gpu_*.py): one line without CUDA, and every code path on tiny
shapes on the CPU (their --smoke runs), with torch.compile replaced by the identity (the
compiled step itself is tests/test_generate_compile.py's). The figures mean nothing here."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from benchmarks import (
    gpu_bandwidth,
    gpu_capped,
    gpu_decode,
    gpu_gemm,
    gpu_gqa,
    gpu_profile,
    gpu_summaries,
    gpu_trace,
    gpu_weights_pass,
)
from benchmarks.__main__ import SUITES
from benchmarks.gpu_report import gpu_summary

import attnlab.model.compiled_decode as compiled_mod
from attnlab.model import layers

GPU_SUITES = [name for name in SUITES if name.startswith("gpu_")]


@pytest.fixture
def no_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    def identity(fn: Callable[..., Any], **options: Any) -> Callable[..., Any]:
        return fn

    monkeypatch.setattr(compiled_mod.torch, "compile", identity)


def test_every_gpu_suite_is_registered_and_skips_in_one_line_without_cuda() -> None:
    assert GPU_SUITES == ["gpu_decode", "gpu_bandwidth", "gpu_trace", "gpu_summaries",
                          "gpu_profile"]
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is here: the suites would run")
    for name in GPU_SUITES:
        result = importlib.import_module(f"benchmarks.{name}").run()
        assert set(result) == {"suite", "skipped"} and "\n" not in result["skipped"]
        assert result["skipped"].startswith(f"{name}: no CUDA GPU here")


@pytest.mark.parametrize("with_tl", [False, True])
def test_trace_smoke_finds_the_same_weights_as_hugging_face(
    with_tl: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every row's weights equal Trace.run's; TransformerLens's row is there where it
    imports, and where it does not, a note says why (the GPU image lacks some packages)."""
    if with_tl:
        pytest.importorskip("transformer_lens")
    else:
        monkeypatch.setitem(sys.modules, "transformer_lens.model_bridge", None)
    result = gpu_trace.run(quick=True, device="cpu")
    errors = result["max_weight_error_vs_trace_run"]
    ours = {gpu_trace.RUN, gpu_trace.TRACED, gpu_trace.HF_LM, gpu_trace.HF_BASE}
    assert set(errors) == ours | ({gpu_trace.TL} if with_tl else set())
    assert max(errors.values()) <= gpu_trace.TOLERANCE
    assert len(result["tables"][0]["rows"]) == 5 + with_tl and result["targets_met"] == {}
    assert ("tl_vs_run" in result["ratios"]) == with_tl
    note = result["notes"][1]
    assert note.startswith("TransformerLens 4" if with_tl else "TransformerLens not run: ")
    assert result["notes"][2].startswith("3xTF32 not run: ")


def test_trace_smoke_in_bfloat16_times_the_explicit_path_beside_and_judges_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """GPU_TRACE_DTYPE=bfloat16: both models in bfloat16, the explicit path's row beside
    Trace.run's (here, with no GPU, the same path: equal weights), no float32-only rows, the
    differences from Hugging Face recorded and no target judged."""
    monkeypatch.setenv("GPU_TRACE_DTYPE", "bfloat16")
    result = gpu_trace.run(quick=True, device="cpu")
    assert result["dtype"] == "bfloat16" and result["targets_met"] == {}
    errors = result["max_weight_error_vs_trace_run"]
    assert set(errors) == {gpu_trace.RUN, gpu_trace.TRACED, gpu_trace.HF_LM, gpu_trace.HF_BASE,
                           gpu_trace.EXPLICIT}
    assert errors[gpu_trace.EXPLICIT] == 0.0
    assert 0.0 < errors[gpu_trace.HF_BASE] < 1e-2  # bfloat16's rounding, not a wrong weight
    assert set(result["max_weight_error_vs_hf_base"]) == {gpu_trace.RUN, gpu_trace.EXPLICIT}
    assert "hf_vs_explicit" in result["ratios"]
    assert result["notes"][1] == "bfloat16: Trace.run runs the explicit path (no weights pass here)"
    monkeypatch.setenv("GPU_TRACE_DTYPE", "float64")
    with pytest.raises(ValueError, match="choose float32, bfloat16 or float16"):
        gpu_trace.run(quick=True, device="cpu")


def test_summaries_smoke_measures_the_trace_or_says_the_names_are_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    result = gpu_summaries.run(quick=True, device="cpu")
    row = result["lengths"]["64"][gpu_summaries.SUMMARY]
    assert ("ms" in row) != ("error" in row)  # measured, or "names not available: ..."
    if "ms" in row:  # each way the flags choose, measured beside it
        assert all("ms" in result["lengths"]["64"][way] for way in gpu_summaries.FLAGS)
    assert "ms" in result["lengths"]["64"][gpu_summaries.HF_EAGER]
    monkeypatch.setattr(gpu_summaries, "SUMMARIES", ("q", "k"))  # names every Trace has
    result = gpu_summaries.run(quick=True, device="cpu")
    assert all("ms" in result["lengths"][T][gpu_summaries.SUMMARY] for T in ("64", "128"))


def test_decode_and_bandwidth_smoke_run_every_variant(no_compile: None) -> None:
    result = gpu_decode.run(quick=True, device="cpu")
    for record in result["records"]:
        assert record["errors"] == {}
        assert set(record["tokens_per_s"]) == {gpu_decode.EAGER, gpu_decode.COMPILED,
                                               gpu_decode.HF_EAGER, gpu_decode.HF_STATIC}
        agree = record["greedy_agreement_with_attnlab_eager"]
        # peaked logits (initializer 0.1): bfloat16 rounding flips no greedy id of the toys
        assert agree[gpu_decode.COMPILED] == 1.0
        assert record["compile_s"] is not None
    bandwidth = gpu_bandwidth.run(quick=True, device="cpu")
    share = bandwidth["record"]["fraction_of_bandwidth"]
    assert set(share) == {gpu_decode.EAGER, gpu_decode.COMPILED} and min(share.values()) > 0
    rows = gpu_summary({"gpu_decode": result, "gpu_bandwidth": bandwidth})
    assert rows == ""  # a CPU smoke run names no GPU, so it makes no GPU row
    assert gpu_summary({}) == ""


def test_gpu_summary_rows_name_the_gpu() -> None:
    record = {"shape": "gpt2", "tokens_per_s": {gpu_decode.COMPILED: 300.0,
                                                gpu_decode.HF_STATIC: 200.0,
                                                gpu_decode.HF_EAGER: 50.0}}
    text = gpu_summary({"gpu_decode": {"machine": {"gpu": "Some GPU"}, "records": [record]}})
    assert "| greedy decode, gpt2 shape" in text and "1.50x / 6.00x faster | Some GPU |" in text


def test_profile_smoke_counts_ops_per_call(no_compile: None) -> None:
    result = gpu_profile.run(quick=True, device="cpu")
    rows = result["rows"]
    assert len(rows) == 4 and all(r["kernels"] > 0 and r["wall_ms"] > 0 for r in rows.values())


def test_the_training_rows_take_the_soonest_and_the_fastest_attnlab_run() -> None:
    """gpu_train runs the GPU recipe in several ways: the time row shows the one that reached
    the target soonest, the tokens/s row the fastest, each naming its way."""
    def run(name: str, seconds: float | None, tokens: float) -> dict[str, object]:
        hit = None if seconds is None else {"seconds": seconds, "step": 1500, "val": 1.46}
        evals = [{"step": 1500, "val": 1.46 if hit else 1.5, "seconds": seconds or 40.0}]
        return {"name": name, "reached": hit, "evals": evals, "tokens_per_s": tokens,
                "mfu": tokens / 1e7, "seconds": seconds or 40.0}

    runs = [run("nanoGPT train.py (re-implemented), compiled", None, 1.6e6),
            run("attnlab train, GPU recipe", 31.5, 2.3e6),
            run("attnlab train, GPU recipe, --cuda_graph true, not compiled", 20.0, 2.0e6),
            run("attnlab train, GPU recipe, --cuda_graph true, blocks compiled", None, 2.9e6)]
    text = gpu_summary({"gpu": {"machine": {"gpu": "Some GPU"}, "target": 1.47, "runs": runs}})
    time_row, tokens_row = text.strip().splitlines()[2:]
    assert "GPU recipe, --cuda_graph true, not compiled)" in time_row and "| 20.0 s" in time_row
    assert "(GPU recipe, --cuda_graph true, blocks compiled)" in tokens_row
    assert "| 1.81x |" in tokens_row  # 2.9e6 / 1.6e6


@pytest.mark.parametrize("s", [1, 2, 3, 4])
def test_a_split_product_is_the_linear_it_splits(s: int) -> None:
    """gpu_gemm's split-K product: the inner sum in s parts gives F.linear's output, for a
    batch of rows as the model passes them."""
    gen = torch.Generator().manual_seed(s)
    x = torch.randn(2, 5, 192, generator=gen)  # (B, T, K)
    weight, bias = torch.randn(48, 192, generator=gen), torch.randn(48, generator=gen)
    expected = torch.nn.functional.linear(x, weight, bias)  # (B, T, N)
    torch.testing.assert_close(gpu_gemm.split_linear(x, weight, bias, s), expected)
    torch.testing.assert_close(gpu_gemm.split_linear(x, weight, None, s), expected - bias)


def test_gqa_probe_runs_both_ways_alike_and_leaves_the_devices_as_they_were(
    tmp_path: Any,
) -> None:
    """gpu_gqa's every case on the CPU: grouped-query k/v copied and handed to SDPA give the
    same output, and GQA_DEVICES is as before once the probe is done."""
    from attnlab.model import sdpa

    if not sdpa.SDPA_GQA:
        pytest.skip("torch < 2.5: no enable_gqa to compare")
    before = set(sdpa.GQA_DEVICES)
    gpu_gqa.main(["--smoke", "--device", "cpu", "--out", str(tmp_path / "gqa.json")])
    assert before == sdpa.GQA_DEVICES
    rows = json.loads((tmp_path / "gqa.json").read_text())["tables"][0]["rows"]
    assert [row[0] for row in rows] == [
        "decode, no mask", "decode, left-padded batch of 4", "decode, static cache slots",
        "prefill, causal", "prefill, window 16"]
    assert all(float(row[4]) <= 1e-5 for row in rows)  # max |difference| of the two ways


def test_gemm_probe_smoke_times_every_split_and_the_trace(tmp_path: Any) -> None:
    """The probe's every code path on the CPU: each product at each split that has parts of
    64 or more, the attention and softmax rows, and the end-to-end trace under each of
    the probe's patches (taken out again after)."""
    forward = layers.Linear.forward
    gpu_gemm.main(["--smoke", "--device", "cpu", "--out", str(tmp_path / "gemm.json")])
    assert layers.Linear.forward is forward
    result = json.loads((tmp_path / "gemm.json").read_text())
    splits = {row["product"]: sorted(map(int, row["ms"])) for row in result["linears"]}
    assert splits == {"q, k, v as one product": [1], "attention out (and q, k, v each)": [1],
                      "MLP in": [1], "MLP out": [1, 2]}  # K = 32, 32, 32, 128
    assert len(result["attention"]) == 3 and len(result["softmax"]) == 4
    errors = result["trace"]["max_weight_error_vs_float32"]
    assert set(errors) == {"attnlab Trace.run", "with q, k, v as one product",
                           "with the fastest splits", "with both", "with TF32"}
    assert max(errors.values()) < 1e-5  # a CPU has no TF32
    assert result["tf32x3"].startswith(("not a CUDA device", "triton not installed"))


def _interpreted_smoke(module: str, tmp_path: Path) -> dict[str, Any]:
    """benchmarks.MODULE's smoke run on the CPU in a process of its own under Triton's
    interpreter (which triton reads as it is imported): its JSON."""
    out = tmp_path / f"{module}.json"
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    subprocess.run([sys.executable, "-m", f"benchmarks.{module}", "--smoke", "--device", "cpu",
                    "--out", str(out)], cwd=root, env=env, check=True, capture_output=True)
    result: dict[str, Any] = json.loads(out.read_text())
    return result


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")
def test_gemm_probe_runs_its_tf32x3_kernel_under_the_interpreter(tmp_path: Path) -> None:
    """The probe's 3xTF32 path on a CPU, in a process of its own under Triton's interpreter
    (read as triton is imported): every product by both kernels at each of their tiles
    equals the float64 product as closely as cuBLAS's float32 one (the interpreter multiplies
    in float32: this checks the kernels' indexing and the weight's split, not TF32's error),
    and the trace with every linear so keeps the weights. In the smoke run in-process, the
    path reports why it did not run."""
    result = _interpreted_smoke("gpu_gemm", tmp_path)
    for row in result["linears"]:
        tiles = row["tf32x3"]
        assert [len(tiles[way]) for way in (gpu_gemm.ON_THE_FLY, gpu_gemm.SPLIT_ONCE)] == [4, 2]
        assert all(found["max_error"] <= 4 * row["cublas_max_error"] + 1e-6
                   for way in tiles.values() for found in way.values()), row
    for best in result["tf32x3"].values():
        assert set(best) == {"(32, 96)", "(32, 32)", "(32, 128)", "(128, 32)"}
    causal = [row for row in result["attention"] if "3xTF32" in row["product"]]
    assert len(causal) == 2 and all(
        row["max_error"] <= 4 * row["cublas_max_error"] + 1e-6 for row in causal), causal
    for way in (gpu_gemm.THREE, gpu_gemm.THREE_SPLIT, gpu_gemm.OURS):
        # float32's own error here is ~1e-8; a weight split read in the wrong memory order
        # (attnlab keeps most weights over (in, out)) was 3.5e-6 off
        assert result["trace"]["max_weight_error_vs_float32"][way] < 1e-6
        assert way in result["trace"]["ms"]


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")
def test_the_weight_split_is_contiguous_whatever_the_weights_memory() -> None:
    """The split-once kernel reads hi and lo as (N, K) rows: a weight over (in, out) memory
    (`GPT.lay_out_weights`) is split into rows too, and hi + lo is the weight exactly."""
    from benchmarks import gpu_tf32x3

    weight = torch.randn(48, 32).t()  # (N, K) = (32, 48) over (in, out) memory
    hi, lo = gpu_tf32x3.split_weight(weight)
    assert hi.is_contiguous() and lo.is_contiguous()
    assert torch.equal(hi + lo, weight) and not torch.equal(hi, weight)
    assert (hi.view(torch.int32) & 0x1FFF).eq(0).all()  # TF32: the low 13 bits are zero


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")
def test_trace_suite_times_the_tf32x3_row_under_the_interpreter(tmp_path: Path) -> None:
    """gpu_trace's 3xTF32 row on a CPU under Triton's interpreter (a process of its own): the
    row is timed beside the others, picks tiles for each linear shape, its weights are within
    float32's error of Trace.run's and Hugging Face's (the interpreter multiplies in
    float32), and it leaves the default row's targets to the default rows."""
    result = _interpreted_smoke("gpu_trace", tmp_path)
    assert set(gpu_trace.THREES) <= set(result["ms"])
    assert {f"hf_vs_run_{key}" for key in gpu_trace.THREES.values()} <= set(result["ratios"])
    assert set(result["max_weight_error_vs_hf_base"]) == {gpu_trace.RUN, *gpu_trace.THREES}
    assert max(result["max_weight_error_vs_hf_base"].values()) < 1e-5
    assert max(result["max_weight_error_vs_trace_run"][name] for name in gpu_trace.THREES) < 1e-6
    assert result["notes"][2].startswith("3xTF32 tiles: attnlab's row by its rule "
                                         "(tf32x3_triton.tiles); the weight split once, "
                                         "per (in, out): (32, 32): (")


def test_the_fused_qkv_patch_makes_one_product_where_there_were_three(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """gpu_gemm's q, k, v patch: two products fewer per layer, the same logits, and the
    modules' own forward back afterwards."""
    model = gpu_gemm.random_gpt(gpu_gemm.TOY, torch.device("cpu"), torch.float32)
    ids = torch.randint(0, 65, (2, 9), generator=torch.Generator().manual_seed(0))
    calls = []
    linear = torch.nn.functional.linear
    monkeypatch.setattr(torch.nn.functional, "linear",
                        lambda *a, **k: calls.append(1) or linear(*a, **k))
    with torch.no_grad():
        plain = model(ids).logits
        n_plain = len(calls)
        with gpu_gemm.fused_qkv(model):
            fused = model(ids).logits
    assert n_plain - (len(calls) - n_plain) == 2 * gpu_gemm.TOY.n_layer
    torch.testing.assert_close(fused, plain, rtol=0, atol=1e-6)
    assert all("forward" not in vars(m) for m in model.modules())


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")
def test_weights_pass_probe_runs_every_way_under_the_interpreter(tmp_path: Path) -> None:
    """gpu_weights_pass on a CPU under Triton's interpreter (float32 there): the forward, the
    explicit path and the weights pass from either lse are each timed at both lengths, and
    the weights pass's weights equal the explicit path's, each within float32's error of
    the softmax computed in float64 from the traced q and k."""
    result = _interpreted_smoke("gpu_weights_pass", tmp_path)
    [found] = result["runs"]
    assert found["dtype"] == "float32"
    for ways in found["lengths"].values():
        assert set(ways) == {"forward (no trace)", *gpu_weights_pass.WAYS}
        assert all("ms" in r for r in ways.values())
        assert all(ways[way]["max_difference"] < 1e-5 for way in gpu_weights_pass.WAYS)
        assert all(0 < ways[way]["max_error_vs_float64"] < 1e-5 for way in gpu_weights_pass.WAYS)


def test_capped_probe_times_the_whole_path_and_the_tiles_alike(monkeypatch: Any) -> None:
    """gpu_capped's smoke run on the CPU: each way timed at both lengths, the tiles' logits
    the whole path's, and the tiles really taken (counted) and only in their way; the
    devices that take tiles are as they were after it."""
    from attnlab.model import explicit

    taken: list[int] = []
    tiled = explicit.tiled_attend

    def counted(*args: Any) -> Any:
        taken.append(1)
        return tiled(*args)

    monkeypatch.setattr(explicit, "tiled_attend", counted)
    result = gpu_capped.run(quick=True, device="cpu")
    [found] = result["runs"]
    for ways in found["lengths"].values():
        assert list(ways) == list(gpu_capped.WAYS) and all("ms" in r for r in ways.values())
        assert ways["capped, tiles"]["max_difference"] < 1e-5
    # two lengths x (measure's warm-up, peak and timed calls, the difference's call, one
    # alternating round) x 2 layers
    assert len(taken) == 2 * 5 * 2
    assert sorted(explicit.TILE_DEVICES) == ["cpu"]
