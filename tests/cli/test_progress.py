"""cli/progress.py: a bar on a terminal, plain lines in a log, evaluations always."""

from __future__ import annotations

import io

import pytest

from attnlab.cli.progress import Counter, Progress, blocks_shown, tokenizing_shown
from helpers import random_ids, seeded_model


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _feed(progress: Progress) -> None:
    for step in (1, 2, 3):
        progress({"step": step, "loss": 2.0 / step, "lr": 1e-3, "tokens_per_s": 1000.0})
    progress({"step": 3, "train_loss": 0.61, "val_loss": 0.7, "train_bpb": 0.88,
              "val_bpb": 1.0099})
    progress.close()


def test_a_log_gets_plain_lines_not_carriage_returns() -> None:
    # tqdm wrote its redraws ("\r 33%|...") into logs when stderr was not a terminal
    log, out = io.StringIO(), io.StringIO()
    _feed(Progress(3, stream=log, out=out, interval_s=0.0))
    assert "\r" not in log.getvalue()
    lines = log.getvalue().splitlines()
    assert [line.split()[:3] for line in lines] == [
        ["step", "1/3", "loss"], ["step", "2/3", "loss"], ["step", "3/3", "loss"]]
    assert "1,000 tokens/s" in lines[0] and lines[-1].endswith("0 s left")
    assert out.getvalue() == "step      3: train 0.6100  val 0.7000  (1.010 bits/byte)\n"


def test_the_first_line_has_no_time_left() -> None:
    # it said "0 s left" after a first step that torch.compile made take 100 s: the speed
    # was one step over the 0 s since that step's own row
    log = io.StringIO()
    progress = Progress(30, stream=log, out=io.StringIO(), interval_s=0.0)
    for step in (1, 2):
        progress({"step": step, "loss": 4.0, "lr": 1e-3, "tokens_per_s": 7.0})
    first, second = log.getvalue().splitlines()
    assert first.endswith("7 tokens/s") and "left" not in first
    assert second.endswith(" s left")  # from the second step on


def test_lines_come_every_interval_and_at_the_end() -> None:
    log = io.StringIO()
    _feed(Progress(3, stream=log, out=io.StringIO(), interval_s=3600.0))
    assert [line.split()[1] for line in log.getvalue().splitlines()] == ["3/3"]


def test_a_terminal_gets_the_bar_and_quiet_gets_evaluations_only() -> None:
    term, out = Terminal(), io.StringIO()
    _feed(Progress(3, stream=term, out=out))
    assert "\r" in term.getvalue() and "3/3" in term.getvalue()
    assert "val 0.7000" in out.getvalue()
    quiet_log, quiet_out = Terminal(), io.StringIO()
    _feed(Progress(3, quiet=True, stream=quiet_log, out=quiet_out))
    assert quiet_log.getvalue() == "" and "val 0.7000" in quiet_out.getvalue()


def test_a_terminal_without_a_size_gets_plain_lines() -> None:
    """A pseudo-terminal of 0 x 0 (`script`, some editors' shells): tqdm drew nothing there,
    so the run showed no progress at all; it gets the log's plain lines. Sized: the bar."""
    import fcntl
    import os
    import pty
    import struct
    import termios

    from attnlab.cli import progress as progress_mod

    leader, follower = pty.openpty()
    with os.fdopen(follower, "w") as stream:
        try:
            assert stream.isatty() and os.get_terminal_size(follower).columns == 0
            assert not progress_mod._sized_terminal(stream)
            assert Progress(3, stream=stream).bar is None  # plain lines
            fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
            assert progress_mod._sized_terminal(stream)
            bar = Progress(3, stream=stream)
            assert bar.bar is not None
            bar.close()
        finally:
            os.close(leader)


def test_a_counter_draws_a_bar_on_a_terminal_and_lines_in_a_log() -> None:
    """`attnlab patch` ran hundreds of corrupted runs (minutes on a CPU) with nothing on the
    screen until the end."""
    term = Terminal()
    counter = Counter("run", "patched", stream=term, delay_s=0.0)
    for done in (32, 64, 70):
        counter(done, 70)
    counter.close()
    drawn = term.getvalue()  # a bar, redrawn at most every 0.1 s, cleared at the end
    assert "\r" in drawn and "/70 [" in drawn and "run/s]" in drawn and drawn.endswith("\r")
    log = io.StringIO()
    counter = Counter("run", "patched", stream=log, interval_s=0.0)
    for done in (32, 64, 70):
        counter(done, 70)
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue() and [line.split()[:3] for line in lines] == [
        ["patched", "32/70", "runs"], ["patched", "64/70", "runs"], ["patched", "70/70", "runs"]]
    # the first line has no estimate yet (nothing timed since the first call)
    assert lines[0] == "patched 32/70 runs" and lines[-1].endswith(" 0 s left")
    assert all(line.endswith(" s left") for line in lines[1:])
    quiet, still = io.StringIO(), Terminal()
    for stream in (quiet, still):  # work shorter than the interval, or the bar's delay
        counter = Counter("run", "patched", stream=stream, interval_s=3600.0, delay_s=3600.0)
        counter(70, 70)
        counter.close()
        assert stream.getvalue() == "", type(stream).__name__


def test_tokenizing_shown_draws_millions_of_characters_and_says_a_long_training() -> None:
    """A first run's tokenization (seconds on 11 MB): a bar of characters in millions, a
    line before a tokenizer trains on a long text; --quiet (and torchrun's other ranks):
    no callbacks at all."""
    term = Terminal()
    with tokenizing_shown(stream=term) as (progress, training):
        assert progress is not None and training is not None
        training("bpe:512", 999_999)  # short: trained before a person notices
        training("bpe:1024", 11_153_940)
        assert isinstance(progress, Counter)
        progress.delay_s = 0.0
        progress(2_630_000, 11_153_940)
    drawn = term.getvalue()
    assert drawn.startswith("tokenizer  training bpe:1024 on 11,153,940 characters (once")
    assert "/11.2M [" in drawn and "character/s]" in drawn and drawn.endswith("\r")
    with tokenizing_shown(quiet=True, stream=term) as callbacks:
        assert callbacks == (None, None)


def test_blocks_shown_counts_a_forward_pass_and_removes_its_hooks() -> None:
    """One long forward pass (`attnlab inspect` of a large model over a long text on a CPU)
    sat silent for minutes; the blocks it finishes now move a bar."""
    import torch

    from attnlab import GPT, GPTConfig, Trace

    model = GPT(GPTConfig.from_name("nano")).eval()
    term = Terminal()
    with torch.no_grad(), blocks_shown(model, "traced", stream=term, delay_s=0.0):
        logits = model(torch.zeros(1, 5, dtype=torch.long)).logits
    assert "/2 [" in term.getvalue() and "block/s]" in term.getvalue()
    assert all(not block._forward_hooks for block in model.blocks)  # removed
    with torch.no_grad():
        assert torch.equal(model(torch.zeros(1, 5, dtype=torch.long)).logits, logits)
    log = io.StringIO()
    with blocks_shown(model, "traced", stream=log, delay_s=0.0):
        Trace(names="attn_weights").run(model, torch.zeros(1, 5, dtype=torch.long))
    assert log.getvalue() == ""  # a log's first line: after FIRST_LINE_S at the soonest


def test_a_stop_request_is_said_at_once_with_how_to_quit() -> None:
    """train() tells the callback of a stop request; the CLI's progress says it on stderr,
    quiet or not (the step, or an evaluation of many batches, may take a while yet)."""
    stream = io.StringIO()
    progress = Progress(10, quiet=True, stream=stream, out=io.StringIO())
    progress({"step": 3, "signal": "SIGINT"})
    progress({"step": 3, "signal": "SIGTERM"})
    assert stream.getvalue() == (
        "\nSIGINT: stopping after this step, then saving a checkpoint (Ctrl-C again: quit "
        "now)\n\nSIGTERM: stopping after this step, then saving a checkpoint\n")


def test_a_counters_delay_counts_from_its_start_and_its_bar_names_the_work() -> None:
    """A model whose first tensor took 2.3 s to load showed its bar only 2 s after that
    (the delay counted from the first call), as a bare "30/146 [...]"; now the bar comes at
    the first call past the delay, and says what it counts."""
    import time

    term = Terminal()
    counter = Counter("tensor", "loaded", stream=term, delay_s=0.05)
    time.sleep(0.1)  # the first tensor, longer than the delay
    counter(1, 146)
    drawn = term.getvalue()
    assert "loaded:" in drawn and "/146 [" in drawn, drawn  # drawn at once
    counter.close()


def test_time_left_is_timed_from_the_first_unit_not_the_start(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`attnlab patch` starts with set-up (the clean and corrupted runs) before its first
    counted run; timed from the Counter's start, its estimates counted the set-up as if
    every run took part of it. Set-up of 99 s, then a run a second: 89 s left after 11 of
    100 (890 s before)."""
    from attnlab.cli import progress

    clock = iter([0.0, 100.0, 110.0, 150.0])  # start, then each call
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(clock))
    log = io.StringIO()
    counter = Counter("run", "patched", stream=log, interval_s=0.0)
    for done in (1, 11, 51):
        counter(done, 100)
    assert log.getvalue().splitlines() == [
        "patched   1/100 runs", "patched  11/100 runs  89 s left",
        "patched  51/100 runs  49 s left"]


def test_patchings_time_left_goes_by_the_blocks_its_passes_run(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Activation patching's passes go in layer order, each restarting at its first patched
    layer, so a run costs less the later it comes; timed by the runs, a GPT-2-small-shaped
    model's first estimate said 345 s with 219 s left. On a clock that moves by the rows each
    block runs (what a block's time is in proportion to), every estimate is the time left."""
    import torch

    from attnlab.cli import progress
    from attnlab.interp.patching import activation_patching, logit_diff_metric

    model = seeded_model("nano", n_layer=4).eval()
    clock = [0.0]  # seconds: a block's forward takes one per row it runs
    for block in model.blocks:
        block.register_forward_pre_hook(lambda _, args: clock.__setitem__(
            0, clock[0] + args[0].shape[0]))
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock[0])
    seen: list[float] = []  # the clock at each line

    class Clocked(Counter):
        def __call__(self, done: int, total: int) -> None:
            super().__call__(done, total)
            seen.append(clock[0])

    log = io.StringIO()
    with torch.no_grad():
        activation_patching(model, random_ids(1, 6, seed=1), random_ids(1, 6, seed=2),
                            logit_diff_metric(1, 2), batch=4,
                            progress=Clocked("run", "patched", stream=log, interval_s=0.0))
    said = [line.split("  ")[-1] for line in log.getvalue().splitlines()[1:]]
    assert len(said) > 10 and said == [f"{seen[-1] - now:,.0f} s left" for now in seen[1:]]


def test_a_bar_told_the_work_moves_by_it_and_says_the_units() -> None:
    """On a terminal tqdm timed patching's runs too: the bar moves by the work (its time left
    with it) and its text counts the runs."""
    term = Terminal()
    counter = Counter("run", "patched", stream=term, delay_s=0.0)
    counter.work(90, 100)  # the first 3 runs' passes ran most of the blocks
    counter(3, 10)
    assert str(counter.bar).startswith("patched 3/10 runs  90%|")  # as it is drawn next
    counter.close()


def test_a_logs_first_line_comes_when_a_terminals_bar_would(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A 1.04B model's load (2 GB of bfloat16, 146 tensors) printed nothing in a log until
    10 s after it began, the whole line interval, where a terminal drew its bar after 2 s.
    Now the first line comes after the delay too (2 s at the soonest), then one every
    interval; work shorter than that still prints nothing."""
    from attnlab.cli import progress

    now = [0.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    log = io.StringIO()
    counter = Counter("tensor", "loaded", stream=log, interval_s=10.0, delay_s=2.0)
    for now[0], done in [(0.7, 1), (1.9, 10), (2.1, 12), (5.0, 40), (12.0, 100), (12.2, 101)]:
        counter(done, 146)
    assert log.getvalue().splitlines() == [
        "loaded  12/146 tensors  17 s left", "loaded 101/146 tensors  5 s left"]
