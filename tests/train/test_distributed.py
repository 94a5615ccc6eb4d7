"""torchrun + DDP: two processes with the same global batch follow one process's loss curve."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attnlab.load import load_checkpoint
from attnlab.train.data import load_dataset
from attnlab.train.distributed import World

FLAGS = ["--data", "copy", "--quiet", "--threads", "1", "--max_iters", "20",
         "--eval_interval", "10", "--eval_iters", "2", "--batch_size", "8", "--n_layer", "1",
         "--n_embd", "32"]


def _losses(run: Path) -> list[tuple[int, str, float]]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], k, r[k]) for r in rows for k in ("loss", "val_loss") if k in r]


def _run(*command: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.slow
@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch without distributed")
@pytest.mark.parametrize("arch", ["gpt2", "llama", "mixture"])
def test_two_processes_follow_the_one_process_curve(tmp_path: Path, arch: str) -> None:
    """A mixture of 16 experts, top 1, over 4 rows a rank: experts one rank's rows never
    chose have no gradient there (DDP stopped on them before)."""
    flags = [*FLAGS, "--arch", arch] if arch != "mixture" else [
        *FLAGS, "--arch", "llama", "--n_experts", "16", "--experts_per_token", "1"]
    one = _run(sys.executable, "-m", "attnlab", "train", "--out", str(tmp_path / "one"), *flags)
    assert one.returncode == 0, one.stderr
    two = _run(sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node", "2", "-m", "attnlab", "train", "--out", str(tmp_path / "two"),
               *flags)
    assert two.returncode == 0, two.stderr
    a, b = _losses(tmp_path / "one"), _losses(tmp_path / "two")
    assert len(a) == len(b) == 22  # 20 steps + 2 evaluations
    for (step, name, x), (step_b, name_b, y) in zip(a, b, strict=True):
        assert (step, name) == (step_b, name_b)
        assert abs(x - y) <= 1e-5, (step, name, x, y)
    assert two.stdout.count("saved") == 1  # only rank 0 speaks
    assert "world    2 processes (torchrun" in two.stdout
    assert load_checkpoint(tmp_path / "two" / "ckpt").meta["world_size"] == 2
    if arch != "gpt2":
        return  # resume below does not depend on the blocks

    # resume works the same: the 2-process checkpoint continues on 2 processes
    more = _run(sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc_per_node", "2", "-m", "attnlab", "train", "--out",
                str(tmp_path / "two"), *FLAGS, "--max_iters", "25", "--resume")
    assert more.returncode == 0, more.stderr
    assert load_checkpoint(tmp_path / "two" / "ckpt").meta["step"] == 25


def test_each_rank_reads_its_own_rows_of_the_global_batch() -> None:
    dataset = load_dataset("copy")
    whole = dataset.batch("train", 8, 16, torch.Generator().manual_seed(0))
    parts = [dataset.batch("train", 8, 16, torch.Generator().manual_seed(0),
                           World(rank, 2).rows(8)) for rank in range(2)]
    assert torch.equal(torch.cat([p[0] for p in parts]), whole[0])
    assert torch.equal(torch.cat([p[1] for p in parts]), whole[1])
    with pytest.raises(ValueError, match="batch_size=7 does not split over 2 processes"):
        World(0, 2).rows(7)
