"""`attnlab inspect` stopped halfway, and the flags it reads: run in-process through the CLI
entry point (its figures and JSON: test_cli_demo.py)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest
import torch

import attnlab.viz
from attnlab.cli import main
from attnlab.cli.common import CLIError
from attnlab.cli.inspect import FIGURE_BYTES
from helpers import nano_checkpoint

pytest.importorskip("matplotlib")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return nano_checkpoint(tmp_path_factory.mktemp("ckpt"), "abcdefghijklmnopqrstuvwxyz .")


def _names(out: Path) -> set[str]:
    return {p.name for p in out.iterdir()}


def test_an_interrupted_inspect_leaves_no_figure_a_rerun_keeps(
        checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Ctrl-C while the figures were drawn left some of them and no attention.json listing
    them, so the next inspect into the same --out kept them beside its own."""
    out = tmp_path / "out"
    flags = ["--out", str(out), "--what", "weights"]
    assert main(["inspect", str(checkpoint), "the cat", *flags, "--layer", "0"]) == 0
    finished = _names(out)
    assert finished == {"weights_L0_H0.png", "weights_L0_H1.png", "attention.json"}

    save, saved = attnlab.viz.save_figure, []

    def stopped(*args: Any, **kwargs: Any) -> list[Path]:
        if saved:  # the second figure: Ctrl-C
            raise KeyboardInterrupt
        saved.append(save(*args, **kwargs))
        return saved[-1]

    monkeypatch.setattr(attnlab.viz, "save_figure", stopped)
    assert main(["inspect", str(checkpoint), "the dog", *flags, "--layer", "1"]) == 130
    assert saved and _names(out) == finished  # the interrupted run's figure is not there
    assert json.loads((out / "attention.json").read_text())["text"] == "the cat"

    monkeypatch.undo()
    assert main(["inspect", str(checkpoint), "the", "--out", str(out), "--what", "grid"]) == 0
    assert _names(out) == {"grid.png", "attention.json"}
    assert "removed  2 files an earlier inspect wrote" in capsys.readouterr().out


def test_a_stage_a_killed_run_left_is_tidied_and_a_running_ones_kept(
        checkpoint: Path, tmp_path: Path) -> None:
    """SIGKILL skips every cleanup: the killed run's hidden stage stayed in --out for good.
    The next run removes the stages of processes that are gone, not those of one running."""
    import os
    import subprocess
    import sys

    out = tmp_path / "out"
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    (out / f".inspect-{gone}-abc").mkdir(parents=True)
    (out / f".inspect-{gone}-abc" / "weights_L0_H0.png").write_bytes(b"half")
    (out / f".inspect-{os.getpid()}-xyz").mkdir()  # this process: alive
    assert main(["inspect", str(checkpoint), "the cat", "--out", str(out), "--what",
                 "grid"]) == 0
    assert _names(out) == {"grid.png", "attention.json", f".inspect-{os.getpid()}-xyz"}


def test_an_inspect_that_fails_leaves_no_directory(
        checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def fails(*args: Any, **kwargs: Any) -> list[Path]:
        raise OSError("disk full")

    monkeypatch.setattr(attnlab.viz, "save_figure", fails)
    assert main(["inspect", str(checkpoint), "the", "--out", str(tmp_path / "new")]) == 1
    assert not (tmp_path / "new").exists()


def test_an_interrupted_summary_leaves_the_last_one_whole(
        checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    flags = ["--out", str(tmp_path), "--summary", "--format", "png,svg"]
    assert main(["inspect", str(checkpoint), "the cat", *flags]) == 0
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert set(before) == {"summary.png", "summary.svg", "summary.json"}

    save = attnlab.viz.save_figure

    def stopped(*args: Any, **kwargs: Any) -> list[Path]:
        save(*args, **kwargs)  # the new figure is drawn, summary.json not yet: Ctrl-C
        raise KeyboardInterrupt

    monkeypatch.setattr(attnlab.viz, "save_figure", stopped)
    assert main(["inspect", str(checkpoint), "a dog", *flags]) == 130
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_what_with_the_page_alone_is_refused(
        checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--format html --what qkv wrote the page and no qkv figure, without a word."""
    assert main(["inspect", str(checkpoint), "the", "--out", str(tmp_path), "--format",
                 "html", "--what", "qkv"]) == 1
    assert capsys.readouterr().err == (
        "attnlab inspect: error: --what qkv picks figures, and --format html writes the page "
        "alone; add a figure format (--format html,png) or drop --what\n")
    assert not any(tmp_path.iterdir())



def test_an_inspect_that_cannot_hold_its_trace_is_refused_before_the_load(
        checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The fit check counted the weights alone: a long text's (T, T) attention weights per
    layer and head, and attention.json's and the figures' copies of them, passed it and
    then ran out of memory. They are counted, the refusal comes before a tensor is read,
    and it names the cause and inspect's own ways out; a smaller selection still runs."""
    import attnlab.model.materialize as materialize
    import attnlab.model.memory as memory
    from attnlab.load import open_checkpoint

    weights = open_checkpoint(checkpoint).weights
    model_bytes = weights.model.num_params(non_embedding=False) * 4 + weights.files.largest()
    # the figure's fixed bytes and 60 kB: not all heads (94 kB), one head's (29 kB)
    monkeypatch.setattr(memory, "available_bytes",
                        lambda device: model_bytes + FIGURE_BYTES + 60_000)
    loads: list[int] = []
    real = materialize.materialize
    monkeypatch.setattr(materialize, "materialize",
                        lambda *args, **kwargs: loads.append(1) or real(*args, **kwargs))
    text = "the quick brown fox jumps over"  # 30 tokens of 32
    flags = ["--out", str(tmp_path / "out"), "--device", "cpu"]
    c = weights.config
    assert main(["inspect", str(checkpoint), text, *flags, "--what", "grid"]) == 1
    err = capsys.readouterr().err
    assert not loads and not (tmp_path / "out").exists()
    assert (f"the traced attn_weights of {c.n_layer} layers x {c.n_head} heads over 30 tokens"
            in err)
    n = c.n_layer * c.n_head * 30 * 30
    assert f"attention.json's and the figures' copies of its {n:,} weights" in err
    assert ("the model alone fits" in err and "a shorter text, fewer layers or heads "
            "(--layer, --head), --what row (one query's weights), or --summary" in err)
    assert "smaller model" not in err and err.rstrip().endswith("--force tries anyway")
    # 2 x 2 heads of 30 x 30 weights: 58 kB in attention.json and the grid, 36 kB traced;
    # one head's fit
    for fewer in (["--what", "grid", "--layer", "0", "--head", "0"], ["--summary"]):
        assert main(["inspect", str(checkpoint), text, *flags, *fewer]) == 0
        assert loads


def test_on_a_gpu_the_hosts_copies_are_checked_against_the_hosts_memory(
        checkpoint: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU the load's check reads the GPU's memory, and attention.json's and the
    figures' copies on the host were counted nowhere: a long text passed the GPU's check and
    then filled the host. They are checked against the host's free memory before the load;
    --force skips it, and --summary (no copies of the weights) needs none."""

    import attnlab.cli.inspect as inspect
    import attnlab.model.memory as memory
    from attnlab.load import open_checkpoint

    c = open_checkpoint(checkpoint).config
    monkeypatch.setattr(inspect, "device_of", lambda args: torch.device("cuda", 0))
    weights = c.n_layer * c.n_head * 30 * 30
    need = (4 + inspect.OUTPUT_BYTES_PER_WEIGHT) * weights + FIGURE_BYTES
    layers, heads = list(range(c.n_layer)), list(range(c.n_head))
    for free, force, written, refused in [(need - 1, False, True, True),
                                          (need, False, True, False),
                                          (need - 1, True, True, False),
                                          (need - 1, False, False, False)]:
        monkeypatch.setattr(memory, "available_bytes",
                            lambda device, free=free: free if device == "cpu" else None)
        args = argparse.Namespace(device="cuda", force=force)
        if refused:
            with pytest.raises(CLIError, match=f"copies of its {weights:,} weights .* on this "
                               "machine but this machine has .* free; to hold less: a shorter "
                               "text.*--force tries anyway"):
                inspect.inspect_memory(args, c, 30, ["attn_weights"], layers, heads)
        else:  # the GPU's own check is the load's: the trace alone
            uses = inspect.inspect_memory(args, c, 30, ["attn_weights"], layers, heads,
                                          written=written)
            assert [u.what.split(" of ")[0] for u in uses] == ["the traced attn_weights"]


@pytest.fixture(scope="module")
def long_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A seeded 2-layer, 4-head model over 9 characters that reads 500-token texts."""
    from attnlab import GPT, GPTConfig
    from attnlab.checkpoint import save_checkpoint
    from attnlab.tokenizers import CharTokenizer

    tok = CharTokenizer(list("abcdefgh "))
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, block_size=512, n_layer=2, n_head=4,
                          n_embd=32))
    return save_checkpoint(tmp_path_factory.mktemp("long") / "ckpt", model, tok)


@pytest.mark.parametrize("flags", [["--what", "grid"],
                                   ["--what", "weights,row", "--layer", "0", "--head", "0"]])
def test_inspects_host_memory_is_what_its_fit_check_counts(
        long_checkpoint: Path, tmp_path: Path, flags: list[str],
        capsys: pytest.CaptureFixture[str]) -> None:
    """attention.json was built as Python lists of floats and its text in memory, twice, and
    the grid drew a float64 copy of a stacked copy: ~92 bytes per traced weight on the host,
    where the trace holds 4. Now the host's allocations (tracemalloc: numpy's and Python's,
    not the trace's tensors) beyond the trace stay within what the fit check counts for them
    (inspect_memory), and the grid's run takes under half the bytes that the weights as
    Python lists alone took; the rerun into the same --out reads the earlier attention.json's
    list of files, not its weights."""
    import tracemalloc

    from attnlab.cli.inspect import inspect_memory
    from attnlab.load import open_checkpoint

    text = "".join("abcdefgh "[(i * 7 + i // 9) % 9] for i in range(500))
    out = str(tmp_path / "out")
    attnlab.viz.core.pyplot()  # matplotlib's import is not inspect's to count
    assert main(["inspect", str(long_checkpoint), text, "--out", out, "--what", "grid"]) == 0
    tracemalloc.start()
    try:
        assert main(["inspect", str(long_checkpoint), text, "--out", out, *flags]) == 0
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    capsys.readouterr()
    c = open_checkpoint(long_checkpoint).config
    layers, heads = ([0], [0]) if "--layer" in flags else (list(range(2)), list(range(4)))
    args = argparse.Namespace(device="cpu")
    _, written = inspect_memory(args, c, 500, {"attn_weights"}, layers, heads)
    assert peak <= written.bytes_in(torch.float32), (peak, written)
    if "--layer" not in flags:
        record = json.loads((tmp_path / "out" / "attention.json").read_text())
        tracemalloc.start()
        try:
            as_lists = [attnlab.viz.to_list(torch.tensor(head["weights"]))
                        for head in record["attention"]]
            lists_bytes = tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()
        assert len(as_lists) == 8 and peak < lists_bytes / 2, (peak, lists_bytes)


def test_experts_draws_a_mixtures_routing_and_a_dense_model_refuses_it(
        checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--what experts: one figure, a token x expert panel per chosen layer; --what all on a
    dense model leaves it out, and --what experts there is refused by name."""
    moe = nano_checkpoint(tmp_path / "moe", "abcdefghijklmnopqrstuvwxyz .", n_experts=3,
                          experts_per_token=2)
    drawn: list[Any] = []
    original = attnlab.viz.plot_experts

    def spy(weights: list[torch.Tensor], *args: Any, **kwargs: Any) -> Any:
        drawn.append(weights)
        return original(weights, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(attnlab.viz, "plot_experts", spy)
        assert main(["inspect", str(moe), "the cat", "--out", str(tmp_path / "a"),
                     "--what", "experts", "--layer", "1"]) == 0
    assert "experts.png" in _names(tmp_path / "a")
    [weights] = drawn
    assert len(weights) == 1 and weights[0].shape == (7, 3)  # layer 1: 7 tokens x 3 experts
    assert ((weights[0] != 0).sum(-1) == 2).all()
    out = tmp_path / "b"
    assert main(["inspect", str(checkpoint), "the cat", "--out", str(out), "--what", "all",
                 "--layer", "0", "--head", "0"]) == 0
    assert "experts.png" not in _names(out)
    capsys.readouterr()
    assert main(["inspect", str(checkpoint), "the cat", "--out", str(tmp_path / "c"),
                 "--what", "experts"]) == 1
    assert "this model has one dense MLP a block (n_experts unset)" in capsys.readouterr().err
