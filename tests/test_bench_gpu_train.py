"""benchmarks/gpu_train.py and nanoGPT's shakespeare_char run (nanogpt_baseline.py) on the
CPU: the runs' command lines parse, the runner reads both kinds of output and stops a run at
its target, the FLOPs are nanoGPT's, and a smoke run of the whole pipeline ends with a
table. None of this times a GPU (benchmarks/gpu_check.sh does, on one)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from attnlab.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
if not (ROOT / "benchmarks" / "__main__.py").is_file():  # pragma: no cover
    pytest.skip("benchmarks/ is not in this tree", allow_module_level=True)
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import gpu_train  # noqa: E402
from benchmarks import nanogpt_baseline as nano  # noqa: E402

TEXT = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n"


@pytest.mark.parametrize("smoke", [False, True])
def test_every_run_is_a_command_line_its_program_takes(smoke: bool, tmp_path: Path) -> None:
    runs = gpu_train.runs(tmp_path / "text.txt", tmp_path, smoke)
    assert [r.kind for r in runs] == ["nanogpt", "attnlab"]
    parser, _ = build_parser()
    for run in runs:
        if run.kind == "nanogpt":
            args = nano.build_parser().parse_args(run.argv[3:])
            assert args.smoke == smoke and args.out == str(tmp_path / "nanogpt")
            continue
        assert run.argv[1:3] == ["-m", "attnlab"]
        args, unknown = parser.parse_known_args(run.argv[3:])
        assert unknown == [] and args.command == "train", run.argv
    assert sum(r.cap_s for r in runs) <= 160 or smoke  # gpu_check.sh gives them 170 s


def test_the_runner_stops_a_run_at_its_target(tmp_path: Path) -> None:
    """Both kinds of output, read as they come; the process is killed at the target."""
    printing = {
        "nanogpt": [json.dumps({"event": "log", "step": 10, "loss": 2.0, "tokens_per_s": 5e5}),
                    json.dumps({"event": "eval", "step": 250, "train": 1.4, "val": 1.52,
                                "time": 0}),
                    json.dumps({"event": "eval", "step": 500, "train": 1.3, "val": 1.46,
                                "time": 0})],
        "attnlab": ["data     fox", "step    250: train 1.5000  val 1.5200  (x bits/byte)",
                    "step    500: train 1.4000  val 1.4650"],
    }
    for kind, lines in printing.items():
        script = (f"import sys, time\nfor line in {lines!r}:\n    print(line, flush=True)\n"
                  "time.sleep(60)\n")
        run = gpu_train.Run(kind, kind, [sys.executable, "-c", script], 30.0, tmp_path / kind)
        began = time.monotonic()
        result = gpu_train.launch(run, 1.47, env={})
        assert time.monotonic() - began < 20  # killed at the target, not after its sleep
        assert [(e["step"], e["val"]) for e in result["evals"]] == [(250, 1.52), (500, 1.465
                                                                                  if kind ==
                                                                                  "attnlab"
                                                                                  else 1.46)]
        assert result["reached"]["step"] == 500
        assert result["tokens_per_s"] == (5e5 if kind == "nanogpt" else None)


def test_flops_per_token_are_nanogpts() -> None:
    """nanoGPT prints 10.65M parameters for shakespeare_char (get_num_params: positions out);
    the count is the baseline model's own at any shape."""
    n = (gpu_train.flops_per_token(6, 6, 384, 256) - 12 * 6 * 6 * 64 * 256) / 6
    assert round(n / 1e6, 2) == 10.65
    toy = nano.NanoGPT(65, 32, 2, 2, 32, bias=False)
    assert gpu_train.flops_per_token(2, 2, 32, 32) == (6 * toy.non_embedding_params()
                                                        + 12 * 2 * 2 * 16 * 32)


def test_nanogpts_schedule_and_split(tmp_path: Path) -> None:
    s = nano.SHAKESPEARE_CHAR
    assert nano.lr_at(0, s) == pytest.approx(1e-3 / 101)
    assert nano.lr_at(100, s) == pytest.approx(1e-3)
    assert nano.lr_at(5000, s) == pytest.approx(1e-4) == nano.lr_at(6000, s)
    (tmp_path / "t.txt").write_text(TEXT)
    assert nano.prepare(tmp_path / "t.txt", tmp_path / "bins") == len(set(TEXT))
    sizes = [(tmp_path / "bins" / f"{split}.bin").stat().st_size // 2 for split in ("train",
                                                                                   "val")]
    assert sizes == [int(len(TEXT) * 0.9), len(TEXT) - int(len(TEXT) * 0.9)]


@pytest.mark.slow  # two processes start torch and train
def test_a_smoke_run_of_the_whole_side_by_side(tmp_path: Path) -> None:
    (tmp_path / "text.txt").write_text(TEXT * 300)
    assert gpu_train.main(["--data", str(tmp_path / "text.txt"), "--out", str(tmp_path / "o"),
                           "--smoke"]) == 0
    result = json.loads((tmp_path / "o" / "gpu_train.json").read_text())
    assert result["smoke"] and len(result["runs"]) == 2
    for run in result["runs"]:
        assert run["reached"] is None and run["tokens_per_s"] > 0, run
        assert [e["step"] for e in run["evals"]] in ([0, 10, 20], [10, 20]), run
    table = (tmp_path / "o" / "gpu_train.md").read_text()
    assert "SMOKE RUN" in table and "nanoGPT train.py (re-implemented)" in table
