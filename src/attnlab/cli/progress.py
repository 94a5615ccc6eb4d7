"""How `attnlab train` shows a run's progress: one line per evaluation on stdout, and the
steps between as a tqdm bar when stderr is a terminal, or as a plain line every few seconds
when it is not (a log file or a pipe would otherwise fill with carriage-return redraws).
Before the first step, a text tokenized for the first time shows its progress the same way
(`tokenizing_shown`), and other long work too (`Counter`).

The training loop (`train/loop.py`) only calls back with its metrics rows; this module decides
what a person sees.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TextIO


def eval_line(row: dict[str, Any]) -> str:
    """`step    100: train 1.9512  val 1.9811  (2.858 bits/byte)`"""
    bits = f"  ({row['val_bpb']:.3f} bits/byte)" if row.get("val_bpb") is not None else ""
    return (f"step {row['step']:>6}: train {row['train_loss']:.4f}  "
            f"val {row['val_loss']:.4f}{bits}")


def _sized_terminal(stream: TextIO) -> bool:
    """A terminal with a size: on a pseudo-terminal of 0 columns or 0 rows (`script`, some
    editors' shells) tqdm draws nothing at all, so progress goes as plain lines there."""
    if not stream.isatty():
        return False
    try:
        size = os.get_terminal_size(stream.fileno())
    except (OSError, ValueError):  # no file descriptor behind the stream
        return True
    return size.columns > 0 and size.lines > 0


class Progress:
    """Callback for `train(callback=...)`; `close()` when the run ends."""

    def __init__(self, total: int, *, quiet: bool = False, stream: TextIO | None = None,
                 out: TextIO | None = None, interval_s: float = 10.0) -> None:
        self.total = total  # steps the run will take (a time budget may set it late)
        self.quiet = quiet
        self.stream = stream or sys.stderr
        self.out = out or sys.stdout
        self.interval_s = interval_s
        self.bar: Any = None
        if not quiet and _sized_terminal(self.stream):
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit="step", dynamic_ncols=True, file=self.stream)
        self._last_line = time.monotonic()
        self._first_step: int | None = None
        self.total_fitted: int | None = None  # the step count a time budget last set

    def __call__(self, row: dict[str, Any]) -> None:
        if "signal" in row:  # a stop request, said at once: the step may take a while yet
            again = " (Ctrl-C again: quit now)" if row["signal"] == "SIGINT" else ""
            line = (f"{row['signal']}: stopping after this step, then saving a "
                    f"checkpoint{again}")
            if self.bar is not None:
                self.bar.write(line, file=self.stream)
            else:
                print(f"\n{line}", file=self.stream, flush=True)
            return
        if "val_loss" in row:
            self._say(eval_line(row))
            return
        if "max_iters" in row:  # a time budget: fitted after the first steps, then refitted
            if self.total_fitted is None:  # after each evaluation, silently
                self._say(f"budget   {row['time_budget']}: {row['max_iters']} steps at "
                          f"{row['steps_per_s']:.1f} steps/s, evaluations included (refitted "
                          "after each evaluation; the lr schedule ends at the last step)")
            self.total = self.total_fitted = int(row["max_iters"])
            return
        step = int(row["step"])
        if self._first_step is None:
            # the speed counts from the end of this call's first step (a resumed run starts
            # where it stands; torch.compile compiles in the first step)
            self._first_step = step
            self._started = time.monotonic()
        if self.bar is not None:
            if self.bar.total != self.total:
                self.bar.total = self.total
            if self.bar.n == 0 and step > 1:
                self.bar.update(step - 1)
            self.bar.update(1)
            self.bar.set_postfix(loss=f"{row['loss']:.4f}", tok_s=f"{row['tokens_per_s']:,.0f}",
                                 refresh=False)
            return
        now = time.monotonic()
        if self.quiet or (now - self._last_line < self.interval_s and step < self.total):
            return
        self._last_line = now
        done = step - self._first_step
        left = ""  # none at the first step: no step is timed yet
        if done > 0:
            rate = done / max(now - self._started, 1e-9)
            left = f"  {max(0, self.total - step) / max(rate, 1e-9):,.0f} s left"
        print(f"step {step:>6}/{self.total}  loss {row['loss']:.4f}  "
              f"{row['tokens_per_s']:,.0f} tokens/s{left}", file=self.stream, flush=True)

    def _say(self, line: str) -> None:
        """A line on stdout that stays (above the bar, if there is one)."""
        if self.bar is not None:
            self.bar.write(line, file=self.out)
        else:
            print(line, file=self.out, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


#: how often a `Counter` prints its plain line where there is no bar (a log, a pipe)
LINE_INTERVAL_S = 10.0
#: ... and its first no sooner than this, whatever its bar's delay: work of a second or two
#: (a small model's export, whose bar comes at once) is over before a line would help
FIRST_LINE_S = 2.0


class Counter:
    """Progress of long work other than training (`attnlab patch`'s corrupted runs, loading
    a model), called as (done, total): a tqdm bar on a sized terminal once the work has
    taken `delay_s` (from the Counter's start), named by `verb`, else a plain line on
    `stream` with the time left, the first after `delay_s` or `FIRST_LINE_S`, the longer
    (`interval_s` if sooner), then every `interval_s` seconds (work shorter than either
    shows nothing); `close()` when the work ends, or `with Counter(...) as progress:`.
    Where the units cost unequal time and the caller knows the work they take (patched runs
    cost less the later their pass restarts: `interp.runs.PassProgress`), it says that
    work by `work(done, total)` before each count, and the time left (the bar's too) goes by
    the work; the counts shown are still the units."""

    def __init__(self, unit: str, verb: str, *, stream: TextIO | None = None,
                 interval_s: float | None = None, delay_s: float = 1.0,
                 scale: bool = False) -> None:
        self.unit, self.verb = unit, verb  # "run", "patched"
        self.scale = scale  # the bar's counts as 2.63M/11.2M (millions of characters)
        self.stream = stream or sys.stderr
        self.interval_s = LINE_INTERVAL_S if interval_s is None else interval_s
        self.delay_s = delay_s
        self.bar: Any = None
        self._terminal = _sized_terminal(self.stream)
        self._started = time.monotonic()
        # a log's first line about when a terminal's bar would come: a model's load waited
        # the whole interval, 10 s, before its first line (docs/performance.md#load-progress)
        first = min(max(self.delay_s, FIRST_LINE_S), self.interval_s)
        self._next_line = self._started + first
        # (when, done) at the first call: the rate is timed from there, not from the start,
        # whose set-up before the first unit (a clean run, a model's first tensor) would
        # inflate every estimate
        self._first: tuple[float, int] | None = None
        self._work: tuple[int, int] | None = None  # (done, total) as `work` last said

    def work(self, done: int, total: int) -> None:
        """The work done of the work in all, said before a count: what the time left is
        timed by, where the units take unequal time."""
        self._work = (done, total)

    def __call__(self, done: int, total: int) -> None:
        # what the time left is in proportion to: the work where it is said, else the units
        timed, timed_total = self._work or (done, total)
        if self._terminal:
            self._draw(done, total, timed, timed_total)
            return
        now = time.monotonic()
        if self._first is None:
            self._first = (now, timed)
        if now < self._next_line:
            return
        self._next_line = now + self.interval_s
        since, timed_then = self._first
        left = "" if timed <= timed_then else (  # no unit timed yet: no estimate
            f"  {(timed_total - timed) * (now - since) / (timed - timed_then):,.0f} s left")
        print(f"{self.verb} {done:>{len(str(total))}}/{total} {self.unit}s{left}",
              file=self.stream, flush=True)

    def _draw(self, done: int, total: int, timed: int, timed_total: int) -> None:
        """The bar at `done` of `total`; where work is said, the bar moves by the work (so
        tqdm's time left is timed by it) and its text says the units."""
        if self.bar is None:
            from tqdm import tqdm

            # the delay counts from this Counter's start, not the first call's: work whose
            # first unit is long (a model's first tensor, a prefill's first block) shows its
            # bar at the next call after `delay_s`, not `delay_s` later
            waited = time.monotonic() - self._started
            shown = {} if self._work is None else {
                "bar_format": "{desc} {percentage:3.0f}%|{bar}| [{elapsed}<{remaining}]"}
            self.bar = tqdm(total=timed_total, desc=self.verb, unit=self.unit,
                            dynamic_ncols=True, file=self.stream, leave=False,
                            delay=max(0.0, self.delay_s - waited), unit_scale=self.scale,
                            **shown)
        if self._work is not None:
            self.bar.set_description_str(f"{self.verb} {done}/{total} {self.unit}s",
                                         refresh=False)
        self.bar.update(timed - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def __enter__(self) -> Counter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextmanager
def blocks_shown(model: Any, verb: str, *, stream: TextIO | None = None,
                 delay_s: float = 2.0) -> Iterator[None]:
    """Inside: each block of `model` (a GPT) that finishes a forward pass moves a `Counter`
    of blocks, so one long pass (a large model over a long text on a CPU) shows where it
    is. A forward hook on each block, removed on the way out."""
    n = len(model.blocks)
    with Counter("block", verb, stream=stream, delay_s=delay_s) as counter:
        handles = [block.register_forward_hook(lambda *_, i=i: counter(i + 1, n))
                   for i, block in enumerate(model.blocks)]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()


# a text tokenized for the first time: its bar after this long on a terminal, a line this
# often in a log (shorter work shows nothing); the line saying a tokenizer is being trained
# from this many characters (bpe:1024 trained on 11M in ~3 s, docs/performance.md#token-cache)
TOKENIZE_DELAY_S = 1.0
TOKENIZE_INTERVAL_S = 10.0
TRAINING_LINE_CHARS = 1_000_000


@contextmanager
def tokenizing_shown(*, quiet: bool = False, stream: TextIO | None = None) -> Iterator[
        tuple[Callable[[int, int], None] | None, Callable[[str, int], None] | None]]:
    """The `progress` and `training` callbacks of `load_dataset` (train/token_cache.py): the
    encoding as a `Counter` of characters, and a line on `stream` (stderr) before a long
    text trains a tokenizer; with `quiet`, none. A cached text calls neither."""
    if quiet:
        yield None, None
        return
    out = stream or sys.stderr

    def training(spec: str, characters: int) -> None:
        if characters >= TRAINING_LINE_CHARS:
            print(f"tokenizer  training {spec} on {characters:,} characters (once: later runs "
                  "on this text read the token cache)", file=out, flush=True)

    with Counter("character", "tokenized", stream=out, interval_s=TOKENIZE_INTERVAL_S,
                 delay_s=TOKENIZE_DELAY_S, scale=True) as counter:
        yield counter, training
