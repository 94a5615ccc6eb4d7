"""Stopping a torchrun run: Ctrl-C (or a scheduler's SIGTERM) reaches torchrun, which passes
it on to its processes; they save once, at the same step, and the command rank 0 prints
continues the run. What torchrun itself prints and exits with:
docs/train.md#stopping-a-torchrun-run.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from attnlab.checkpoint import load_train_state
from attnlab.load import load_checkpoint
from attnlab.model.gpt import GPTConfig
from attnlab.train import TrainConfig, train
from attnlab.train.data import load_dataset

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
            "2"]
# endless (max_iters) and never evaluating: a stop is the only way out, and it saves
FLAGS = ["--data", "copy", "--quiet", "--threads", "1", "--max_iters", "100000",
         "--eval_interval", "100000", "--batch_size", "8", "--n_layer", "1", "--n_embd", "32"]
HINT = re.compile(r"^interrupted: checkpoint saved in (\S+); continue with: (.+)$", re.M)

def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def _steps(run: Path) -> list[int]:
    if not (run / "metrics.jsonl").exists():
        return []
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [row["step"] for row in rows if "loss" in row]


def _workers(torchrun: int) -> dict[int, int]:
    """{rank: pid} of torchrun's processes (its children, RANK in their environment)."""
    ranks = {}
    for proc in Path("/proc").iterdir():
        try:
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            env = (proc / "environ").read_bytes().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue  # not a process, or gone
        rank = [e[5:] for e in env if e.startswith(b"RANK=")]
        if ppid == torchrun and rank:
            ranks[int(rank[0])] = int(proc.name)
    return ranks


def _interrupt(run: Path, stop: Callable[[subprocess.Popen[str]], None]
               ) -> tuple[int, str, float]:
    """Start the endless run in `run` under torchrun, `stop` it once it has taken 3 steps:
    (torchrun's exit status, everything printed, seconds from the stop to torchrun's exit)."""
    # its own session, as a shell gives a job: a signal to its group is what Ctrl-C sends
    with subprocess.Popen([*TORCHRUN, "-m", "attnlab", "train", "--out", str(run), *FLAGS],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env=_env(), start_new_session=True) as proc:
        try:
            deadline = time.monotonic() + 120
            while len(_steps(run)) < 3 and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            assert proc.poll() is None, "the run ended before it was stopped"
            stopped = time.monotonic()
            stop(proc)
            # torchrun kills processes still running after 30 s (--shutdown_timeout): a rank
            # left waiting in a collective would show as a run that takes that long
            out, _ = proc.communicate(timeout=60)
            return proc.returncode, out, time.monotonic() - stopped
        finally:
            if proc.poll() is None:  # hung: kill torchrun and its processes
                for pid in _workers(proc.pid).values():
                    os.kill(pid, signal.SIGKILL)
                os.killpg(proc.pid, signal.SIGKILL)


def _check_saved_once(run: Path, out: str) -> tuple[int, str]:
    """The checkpoint is whole, at the last step taken, and the only one; (its step, the
    command the output says continues it)."""
    hint = HINT.search(out)
    assert hint is not None, out
    assert hint[1] == str(run / "ckpt")
    saved = load_checkpoint(run / "ckpt")
    step = saved.meta["step"]
    assert step == _steps(run)[-1] >= 3  # every rank stopped after the same step
    assert saved.meta["world_size"] == 2
    assert load_train_state(run / "ckpt")["step"] == step  # the optimizer state is whole too
    # no copy a save cut short left beside it
    assert not [p.name for p in run.iterdir() if p.name.startswith(".ckpt")]
    assert "forcefully" not in out  # torchrun did not have to kill a rank
    return step, hint[2]


@pytest.mark.slow
@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch without distributed")
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds torchrun's processes in /proc")
def test_ctrl_c_to_torchrun_saves_once_and_the_printed_command_resumes(tmp_path: Path) -> None:
    run = tmp_path / "run"
    status, out, seconds = _interrupt(run, lambda proc: os.killpg(proc.pid, signal.SIGINT))
    step, command = _check_saved_once(run, out)
    # torchrun raises the signal it passed on once its processes are done: its traceback
    # comes last and it exits 1 (docs/train.md#stopping-a-torchrun-run)
    assert status == 1, out
    assert "SignalException" in out.splitlines()[-1]
    assert seconds < 25, out  # no rank waited for torchrun's kill

    words = shlex.split(command)
    assert words[:4] == ["torchrun", "--standalone", "--nproc_per_node", "2"], command
    more = subprocess.run([*TORCHRUN, *words[4:], "--max_iters", str(step + 2), "--quiet"],
                          capture_output=True, text=True, env=_env(), timeout=120)
    assert more.returncode == 0, more.stderr
    assert f"resumed  from step {step} of {step + 2}" in more.stdout
    assert load_checkpoint(run / "ckpt").meta["step"] == step + 2
    assert _steps(run)[-3:] == [step, step + 1, step + 2]  # on from the saved step


@pytest.mark.slow
@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch without distributed")
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds torchrun's processes in /proc")
def test_a_stop_torchrun_did_not_send_ends_in_a_report_of_rank_0_and_its_resume_line(
    tmp_path: Path
) -> None:
    """A SIGTERM to one process (not to torchrun): torchrun reports its processes' exit
    statuses. It reported every rank (a rank that exited first got rank 0 killed, maybe
    before it printed the resume line), under "To enable traceback see ...". Now rank 0
    (local rank 0: one process per torchrun) alone exits non-zero, and the report of it holds
    the resume line."""
    run = tmp_path / "run"

    def stop_rank_1(proc: subprocess.Popen[str]) -> None:
        os.kill(_workers(proc.pid)[1], signal.SIGTERM)

    status, out, seconds = _interrupt(run, stop_rank_1)
    _, command = _check_saved_once(run, out)
    assert status == 1, out
    assert seconds < 25, out
    report = out[out.index("Root Cause"):]
    assert "<NO_OTHER_FAILURES>" in out  # rank 1 exited 0: rank 0 speaks for the run
    assert re.search(r"rank\s+: 0 \(local_rank: 0\)\n\s+exitcode\s+: 130 ", report), report
    assert f"continue with: {command}" in report


def test_a_second_ctrl_c_under_torchrun_quits_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under torchrun a process does not see the terminal's Ctrl-C: torchrun passes the
    first on as SIGINT and answers the second with SIGTERM, which a stopping process took
    for one more stop request, so "Ctrl-C again: quit now" did not quit."""
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "test")  # what torchrun sets for its processes
    dataset = load_dataset("copy")
    model_config = GPTConfig(vocab_size=dataset.tokenizer.vocab_size,
                             block_size=dataset.max_block_size, n_layer=1, n_head=2, n_embd=16)
    config = TrainConfig(max_iters=20, batch_size=4, eval_interval=10, eval_iters=2)

    def callback(row: dict[str, Any]) -> None:
        if row.get("step") == 12 and "loss" in row:
            os.kill(os.getpid(), signal.SIGINT)  # torchrun passing on the first Ctrl-C
            os.kill(os.getpid(), signal.SIGTERM)  # and its answer to the second

    with pytest.raises(KeyboardInterrupt):
        train(model_config, config, dataset, tmp_path, callback=callback)
    assert load_checkpoint(tmp_path / "ckpt").meta["step"] == 10  # the last evaluation's
