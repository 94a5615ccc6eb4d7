"""Smoke tests of the benchmark suites on toy sizes: result structure, never speed."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from attnlab.cli import main as cli_main
from attnlab.cli.bench import find_checkout
from attnlab.model.gpt import GPT, GPTConfig
from attnlab.model.trace import Trace

ROOT = Path(__file__).resolve().parents[1]  # this checkout's benchmarks/, not an install's
if not (ROOT / "benchmarks" / "__main__.py").is_file():  # pragma: no cover
    pytest.skip("benchmarks/ is not in this tree", allow_module_level=True)
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import arch_compare, attention_op, memory, train_quality, train_step  # noqa: E402
from benchmarks import nanogpt_baseline as nano  # noqa: E402
from benchmarks.__main__ import main as bench_main  # noqa: E402
from benchmarks.__main__ import render_any, run_suite, write_readme_table  # noqa: E402
from benchmarks.common import markdown  # noqa: E402

TOY = dict(vocab_size=65, block_size=16, n_layer=1, n_head=2, n_embd=16)


def test_attention_suite_times_every_path_and_size() -> None:
    result = attention_op.run(quick=True, sizes=(8, 16), batch=2, n_head=2, head_size=8,
                              rounds=2)
    assert [(r["T"], r["mode"]) for r in result["records"]] == [
        (8, "fwd"), (8, "fwd+bwd"), (16, "fwd"), (16, "fwd+bwd")]
    for r in result["records"]:
        assert set(r["ms"]) == {"explicit", "fused", "sdpa"}
        assert all(v > 0 for v in r["ms"].values())
    assert result["target_met"] is None  # T=256 was not measured
    (t,) = result["tables"]
    assert len(t["rows"]) == 4 and len(t["rows"][0]) == len(t["columns"])


def test_baseline_has_attnlab_parameter_count() -> None:
    # same shape, same parameters: one c_attn holds what attnlab's query/key/value hold
    c = GPTConfig(**TOY)
    baseline = nano.NanoGPT(c.vocab_size, c.block_size, c.n_layer, c.n_head, c.n_embd)
    assert sum(p.numel() for p in baseline.parameters()) == GPT(c).num_params(False)


def test_both_training_steps_learn() -> None:
    c = GPTConfig(**TOY)
    ids = train_step.token_array(5_000, c.vocab_size) % 4  # a 4-letter text: easy to learn
    config = train_step.TrainConfig(batch_size=8, lr=1e-2, warmup_iters=0)
    lever = train_step.LEVERS[train_step.BEST]
    ours, _ = train_step.attnlab_step(c, config, ids, lever)
    base = train_step.baseline_step(c, ids, 8)
    for step in (ours, base):
        losses = [step() for _ in range(30)]
        assert sum(losses[-5:]) / 5 < losses[0] - 0.5


def test_train_suite_reports_ratio_and_mfu() -> None:
    levers = ("attnlab fp32", train_step.BEST)
    result = train_step.run(quick=True, shape=TOY, batch=2, levers=levers, threads=(1,),
                            rounds=1)
    names = [r["variant"] for r in result["records"]]
    assert names == ["nanoGPT baseline", *levers]
    for r in result["records"]:
        assert r["tokens_per_s"] > 0 and r["mfu"] > 0 and r["x_baseline"] > 0
    assert result["records"][0]["x_baseline"] == 1.0
    assert set(result["peaks_gflops"]) == {"fp32", "bf16"}
    assert isinstance(result["target_met"], bool)
    with pytest.raises(ValueError, match="unknown levers"):
        train_step.run(quick=True, shape=TOY, levers=("attnlab turbo",))


def test_mfu_is_against_the_fp32_peak_where_bfloat16_is_emulated(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # an emulated bf16 mm measured 1 GFLOP/s: MFU against it read 279%
    for units, want in ((True, "bf16"), (False, "fp32")):
        monkeypatch.setattr(train_step, "fast_bf16", lambda units=units: units)
        assert train_step.mfu_peak(train_step.BEST) == want
        assert train_step.mfu_peak("attnlab fp32") == "fp32"


def test_memory_suite_kv_cache_matches_formula() -> None:
    result = memory.run(quick=True, shape=TOY, batch=2, workloads=())  # one subprocess
    assert result["kv_cache_matches_formula"] is True
    assert [r["nbytes"] for r in result["kv_cache"]] == [
        2 * 1 * 2 * 2 * t * 8 * size for size in (4, 2) for t in (8, 16)]
    peaks = result["peak_rss_mb"]
    assert list(peaks) == ["import torch + attnlab"] and peaks["import torch + attnlab"] > 10
    with pytest.raises(ValueError, match="unknown workloads"):
        memory.run(shape=TOY, workloads=("train-fp64",))


def test_quality_suite_runs_the_real_loop(tmp_path: Path) -> None:
    text = tmp_path / "text.txt"
    text.write_text("to be or not to be, that is the question.\n" * 60)
    toy_model = {k: v for k, v in TOY.items() if k != "vocab_size"}
    recipes = {
        "nanoGPT recipe": train_quality.Recipe(toy_model, {"max_iters": 40, "batch_size": 4}),
        "attnlab best": train_quality.Recipe(
            toy_model, {"max_iters": 40, "batch_size": 4, "dtype": "bfloat16"},
            explicit_attention=True, fused_adamw=True),
    }
    forward, threads = GPT.forward, torch.get_num_threads()
    result = train_quality.run(quick=True, data=text, recipes=recipes)
    assert GPT.forward is forward and torch.get_num_threads() == threads  # levers undone
    for r in result["results"].values():
        assert r["evals"] and r["evals"][-1]["step"] == 2  # 40 // 20 iterations
        assert r["final_val_loss_fp32"] is not None and r["seconds"] > 0
    assert len(result["tables"][0]["rows"]) == 2


def test_missing_suite_is_skipped_and_readme_table_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from benchmarks import __main__ as entry

    monkeypatch.setitem(entry.SUITES, "decode", "no_such_suite")
    skipped = run_suite("decode", quick=True)
    assert "skipped" in skipped and "no_such_suite" in render_any(skipped)
    assert write_readme_table(tmp_path) is None  # no full results yet
    fake = {"suite": "attention", "machine": {"cpu": "Test CPU", "cores": 2, "torch": "x",
                                              "python": "3", "load_avg_1m": 1.0},
            "tables": [{"title": "T", "columns": ["a", "b"], "rows": [[1, 2.5], [2, None]]}]}
    (tmp_path / "attention.json").write_text(json.dumps(fake))
    path = write_readme_table(tmp_path)
    assert path is not None
    text = path.read_text()
    assert "Test CPU (2 cores" in text and markdown(fake["tables"][0]) in text
    assert "| 2 | – |" in text  # a missing measurement reads as a dash, not Python's None
    assert bench_main(["readme", "--out", str(tmp_path)]) == 0


def test_cli_bench_finds_the_checkout_and_rejects_unknown_suites(
    capsys: pytest.CaptureFixture[str],
) -> None:
    found = find_checkout()
    assert found is not None and (found / "benchmarks" / "__main__.py").is_file()
    with pytest.raises(SystemExit) as exc:
        cli_main(["bench", "nope"])
    assert exc.value.code == 2
    assert "invalid choice" in capsys.readouterr().err
    # every suite `python -m benchmarks` runs, `attnlab bench` takes
    from benchmarks.__main__ import SUITES

    from attnlab.cli import bench as cli_bench

    assert (*SUITES, "all", "readme") == cli_bench.SUITES


def test_arch_suite_trains_both_arches_at_the_same_parameter_count(tmp_path: Path) -> None:
    text = tmp_path / "text.txt"
    text.write_text("to be or not to be, that is the question\n" * 60)
    result = arch_compare.run(quick=True, data=text, max_iters=2)
    runs = result["runs"]
    assert set(runs) == {"gpt2", "llama"} and runs["gpt2"]["steps"] == 2
    assert abs(runs["llama"]["params"] / runs["gpt2"]["params"] - 1) < 0.005
    assert all(r["val_loss"] is not None and r["cpu_s"] > 0 for r in runs.values())
    assert len(result["tables"][0]["rows"]) == 2


@pytest.mark.parametrize("argv", [["bench"], ["bench", "--quick"]])
def test_cli_bench_as_the_readme_shows_writes_under_cwd_and_leaves_the_readme(
    argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Python 3.11 refused both ("invalid choice: ['all']"), and a run wrote
    # benchmarks/results/ and rewrote the README block of the package
    from benchmarks import __main__ as entry

    ran: list[tuple[str, bool]] = []

    def fake_suite(name: str, quick: bool) -> dict[str, object]:
        ran.append((name, quick))
        return {"suite": name, "tables": [{"title": "T", "columns": ["a"], "rows": [[1]]}]}

    monkeypatch.setattr(entry, "run_suite", fake_suite)
    results = ROOT / "benchmarks" / "results"
    recorded = {p.name: p.read_bytes() for p in results.iterdir()}
    readme = (ROOT / "README.md").read_bytes()
    monkeypatch.chdir(tmp_path)
    assert cli_main(argv) == 0
    quick = "--quick" in argv
    assert ran == [(name, quick) for name in entry.SUITES]
    suffix = ".quick.json" if quick else ".json"
    written = sorted(p.name for p in (tmp_path / "bench-results").iterdir())
    expected = [f"{name}{suffix}" for name in entry.SUITES] + ([] if quick else ["README_table.md"])
    assert written == sorted(expected)
    assert {p.name: p.read_bytes() for p in results.iterdir()} == recorded
    assert (ROOT / "README.md").read_bytes() == readme


def test_bench_record_and_out_together_are_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        bench_main(["readme", "--record", "--out", str(tmp_path)])


def test_trace_suite_times_attnlab_and_hugging_face_on_the_same_weights() -> None:
    from benchmarks import trace as trace_suite

    result = trace_suite.run(quick=True)
    ms = result["ms"]
    assert {"attnlab forward (no trace)", "attnlab trace: attn_weights",
            "attnlab trace: every name", trace_suite.EVERY_ACTIVATION,
            "HF eager output_attentions"} <= set(ms)
    assert all(v > 0 for v in ms.values())
    assert result["hf_weights_max_error"] < 1e-5  # same weights, same ids
    assert result["float16_max_error"] <= 2**-12
    (t,) = result["tables"]
    assert len(t["rows"]) == len(ms) and all(len(r) == len(t["columns"]) for r in t["rows"])
    # how far a forward on these kernels could be ahead: each other tool's time / the floor
    assert {"HF eager output_attentions", trace_suite.HF_BASE} <= set(result["ceiling"])
    assert not any(name.startswith("attnlab") or name in trace_suite.FLOORS
                   for name in result["ceiling"])
    assert result["run_equals_trace"]  # Trace.run's weights, bit for bit


def test_summaries_suite_times_the_summaries_against_the_forward() -> None:
    from benchmarks import summaries as summaries_suite

    result = summaries_suite.run(quick=True)
    assert set(result["ms"]) == {summaries_suite.FORWARD, summaries_suite.LAST,
                                 summaries_suite.SUMMARIES}
    assert all(v > 0 for v in result["ms"].values())
    # the full-size check of the suite, at toy size: layer 0's summaries from the weights
    assert set(result["errors"]) == {"attn_entropy", "attn_sink", "attn_received",
                                     "attn_distance", "attn_max"}
    assert max(result["errors"].values()) < 1e-5
    assert result["target_met"] is None  # a quick run claims no target
    (t,) = result["tables"]
    assert len(t["rows"]) == 3 and all(len(r) == len(t["columns"]) for r in t["rows"])
    # each first call ran in a process of its own and came back with its time
    assert all(row[3] > 0 for row in t["rows"])


def test_patching_suite_times_every_way_on_the_same_grid() -> None:
    """Every exact way gives the default's effects (up to float32 rounding of other batch
    shapes); attribution is an estimate, so only its presence is checked."""
    from benchmarks import patching as patching_suite

    result = patching_suite.run(quick=True)
    ms, diffs = result["ms"], result["max_effect_difference"]
    assert patching_suite.DEFAULT in ms and len(ms) >= 5 and all(v > 0 for v in ms.values())
    assert result["runs"] == 2 * 2 + 2 * 8  # toy: 2 layers x 2 heads + 2 layers x 8 positions
    assert diffs[patching_suite.DEFAULT] == 0.0
    exact = [name for name in ms if "attribution" not in name]
    assert len(exact) >= 4 and all(diffs[name] < 1e-5 for name in exact)
    (t,) = result["tables"]
    assert len(t["rows"]) == len(ms) and all(len(r) == len(t["columns"]) for r in t["rows"])


def test_trace_floor_runs_the_products_of_a_traced_forward() -> None:
    from benchmarks import trace as trace_suite
    from torch.utils.flop_counter import FlopCounterMode

    torch.manual_seed(0)
    model = GPT(GPTConfig(**{**TOY, "block_size": 300})).eval()  # 300: a partial last block
    ids = torch.randint(0, TOY["vocab_size"], (1, 300))
    counts = []
    for run in (trace_suite.products_only(model, 300),
                lambda: model(ids, trace=Trace(names=["attn_weights"])),
                trace_suite.products_only(model, 300, stop=True),
                lambda: Trace(names=["attn_weights"]).run(model, ids)):
        with torch.inference_mode(), FlopCounterMode(display=False) as counter:
            run()
        counts.append(counter.get_total_flops())
    assert counts[0] == counts[1] > counts[2] == counts[3] > 0


def test_roofline_suite_relates_decode_to_the_measured_bandwidth() -> None:
    from benchmarks import roofline

    c = GPTConfig(**TOY)
    # a step streams every weight once: the tied head counts once, the position table not
    params = GPT(c).num_params(non_embedding=False)
    assert roofline.streamed_bytes(c) == 4 * (params - c.block_size * c.n_embd)
    result = roofline.run(quick=True)
    assert [r["threads"] for r in result["records"]] == [1, 2]
    for r in result["records"]:
        assert r["GB_per_s"]["float32 x @ W"] > 0
        # at 2 threads the product in blocks per thread is timed too; the faster sets the roof
        assert (roofline.BLOCKS in r["GB_per_s"]) == (r["threads"] == 2)
        assert r["bandwidth_GB_per_s"] == max(
            r["GB_per_s"]["float32 x @ W"], r["GB_per_s"].get(roofline.BLOCKS, 0))
        assert r["roofline_tok_s"] == pytest.approx(
            r["bandwidth_GB_per_s"] * 1e9 / r["step_bytes"])
        assert r["fraction"] == pytest.approx(r["decode_tok_s"] / r["roofline_tok_s"])
        if roofline.FBGEMM:  # float16 weights: half the bytes, the rounding measured
            f16 = r["float16_weights"]
            assert f16["roofline_tok_s"] == pytest.approx(
                r["roofline_tok_s"] * roofline.streamed_bytes(c) / roofline.streamed_bytes(c, 2))
            assert f16["speedup"] == pytest.approx(f16["decode_tok_s"] / r["decode_tok_s"])
            assert 0 < f16["max_abs_logit_change"] < 0.1
            assert 0 <= f16["greedy_ids_before_first_difference"] <= 8
    names = [t["title"] for t in result["tables"]]
    assert ("Decode with float16 weights" in names[1]) == roofline.FBGEMM
    assert [row[0] for row in result["tables"][-1]["rows"]][:2] == ["gpt2", "gpt2-medium"]


def test_a_trace_variants_first_call_runs_alone_as_a_full_run_measures_it() -> None:
    """A full run measures each variant's first call in a process of its own (`first_call`,
    through `common.in_own_process`); the quick run above keeps its own process."""
    from benchmarks import trace as trace_suite
    from benchmarks.common import in_own_process

    seconds, rise = in_own_process("trace", "first_call", "attnlab", trace_suite.RUN, True)
    assert seconds > 0 and (rise is None or rise >= 0)


def test_a_trace_variants_first_call_sets_up_only_its_own_tool(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A child process measuring Hugging Face's row builds no attnlab model (and with the
    `bench` extra, boots no TransformerLens bridge): only its tool's variants."""
    from benchmarks import trace as trace_suite

    def fail(*args: object) -> None:
        raise AssertionError("attnlab's variants were built for Hugging Face's first call")

    monkeypatch.setattr(trace_suite, "attnlab_variants", fail)
    seconds, rise = trace_suite.first_call("HF", trace_suite.HF_BASE, True)
    assert seconds > 0 and (rise is None or rise >= 0)
    with pytest.raises(AssertionError, match="attnlab's variants were built"):
        trace_suite.first_call("attnlab", trace_suite.RUN, True)


def test_a_suite_says_what_it_timed_and_that_it_still_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A full suite printed nothing between "running suite 1 of 1" and its tables, minutes
    apart. Now each case `alternate` times is a line on stderr, and a case that runs on
    without one (a training run, a subprocess) gets a line every QUIET_S; stdout keeps the
    tables alone."""
    import time
    import types

    from benchmarks import __main__ as entry
    from benchmarks import common

    def run(quick: bool) -> dict[str, object]:
        common.alternate({"one": lambda: None, "two": lambda: None}, rounds=3, warmup=0)
        time.sleep(0.5)  # a case that says nothing itself
        return {"tables": [common.table("T", ["a"], [[1]])]}

    suite = types.ModuleType("benchmarks.silent_suite")
    suite.run = run  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "benchmarks.silent_suite", suite)
    monkeypatch.setitem(entry.SUITES, "silent", "silent_suite")
    monkeypatch.setattr(common, "QUIET_S", 0.1)
    assert bench_main(["silent", "--quick", "--out", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    lines = err.splitlines()
    timed = [i for i, line in enumerate(lines) if line.startswith("  timed one, two: 3 rounds")]
    still = [i for i, line in enumerate(lines)
             if line.startswith("  silent: still running (")]
    assert len(timed) == 1 and len(still) >= 2, err
    assert timed[0] < still[0] and "still running" not in out and "timed" not in out


def test_slow_rounds_say_how_far_they_are(monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """The trace suite's five rounds took eight minutes with only "still running" lines
    between them. A round after QUIET_S / 2 of silence now says which it was; the last round
    is the "timed" line, and fast rounds stay quiet."""
    import time

    from benchmarks import common

    monkeypatch.setattr(common, "QUIET_S", 0.1)
    common.alternate({"slow": lambda: time.sleep(0.06)}, rounds=3, warmup=0)
    monkeypatch.setattr(common, "QUIET_S", 60.0)
    common.alternate({"fast": lambda: None}, rounds=50, warmup=0)
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(" (")[0].split(" in ")[0] for line in lines] == [
        "  round 1 of 3", "  round 2 of 3", "  timed slow: 3 rounds",
        "  timed fast: 50 rounds"], lines
