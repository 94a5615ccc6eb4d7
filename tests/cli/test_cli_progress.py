"""What the commands show on stderr while long work runs (cli/progress.py's `Counter`).

On a CPU a 1.2B model (Llama-3.2-1B's shape) sat silent for 10 s to minutes in each of these:
a 1,500-token prompt's prefill (45 s), --weights float16 packing (44 s), a --prompt-file
batch (30 s), heads' trace (48 s), lens' rows (51 s), inspect's attention.json (35 s) and its
figures in a log (minutes), export's weight files (10 s). Here every line a log would get
every 10 s comes at every call (`LINE_INTERVAL_S` 0), on tiny models; stdout and stderr
are one buffer, so the order a person reads them in is checked too.
"""

from __future__ import annotations

import io
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from attnlab import GPT, GPTConfig
from attnlab.checkpoint import save_checkpoint
from attnlab.cli import main
from attnlab.cli import progress as progress_mod
from attnlab.tokenizers import get_tokenizer

TEXT = "the quick brown fox jumps over the lazy dog\n"


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    tokenizer = get_tokenizer("char", TEXT)
    torch.manual_seed(0)
    config = GPTConfig.from_name("nano", vocab_size=tokenizer.vocab_size, block_size=32,
                                 init_std=0.3)  # 2 layers
    return save_checkpoint(tmp_path / "ckpt", GPT(config).eval(), tokenizer)


def _screen(monkeypatch: pytest.MonkeyPatch) -> io.StringIO:
    """stdout and stderr as one log (not a terminal), with a progress line at every call
    (set in the test itself: pytest sets its own capture again after the fixtures)."""
    # raising=False: on code without it the test fails on its assertions, not here
    monkeypatch.setattr(progress_mod, "LINE_INTERVAL_S", 0.0, raising=False)
    shown = io.StringIO()
    monkeypatch.setattr(sys, "stdout", shown)
    monkeypatch.setattr(sys, "stderr", shown)
    return shown


def _counts(shown: str, verb: str, unit: str) -> list[str]:
    """The "done/total" of each progress line `verb N/M units  T s left` (the first has no
    time left: no unit is timed yet)."""
    return re.findall(rf"^{re.escape(verb)} +(\d+/\d+) {unit}s(?:  [\d,]+ s left)?$", shown,
                      flags=re.M)


def test_a_prompts_prefill_is_counted_before_the_prompt_is_echoed(
        checkpoint: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The prompt was echoed, then the prefill ran with nothing more on the screen; a bar
    drawn then would share the echoed line, so the prefill's blocks come first."""
    screen = _screen(monkeypatch)
    assert main(["generate", str(checkpoint), "the fox", "--max-new-tokens", "3",
                 "--temperature", "0"]) == 0
    shown = screen.getvalue()
    assert _counts(shown, "prefilled", "block") == ["1/2", "2/2"]
    assert shown.index("prefilled 2/2 blocks") < shown.index("the fox")
    assert re.search(r"^the fox.{3}\n\[3 new tokens in ", shown, flags=re.M), shown


def test_compile_is_said_and_done_before_the_prompt_is_echoed(
        checkpoint: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--compile compiled at the second token: GPT-2 small's stream stopped after its first
    token for 24 s on a CPU. Now a line says so and the compile runs before the echo."""
    screen = _screen(monkeypatch)
    import attnlab.model.compiled_decode as compiled_mod

    seen_then: list[str] = []  # the screen when the compiled step first runs

    def compile(fn: Any, **options: Any) -> Any:
        def first_call(*args: Any) -> Any:
            if not seen_then:
                seen_then.append(screen.getvalue())
            return fn(*args)
        return first_call

    monkeypatch.setattr(compiled_mod.torch, "compile", compile)
    assert main(["generate", str(checkpoint), "the fox", "--max-new-tokens", "4",
                 "--temperature", "0", "--compile"]) == 0
    assert seen_then and seen_then[0].endswith(
        "[compiling the decode step: its first call takes tens of seconds]\n")
    assert "the fox" not in seen_then[0] and "the fox" in screen.getvalue()


def test_a_prompt_files_batches_count_their_prefill_and_tokens(
        checkpoint: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A batch printed nothing until all its tokens were made (30 s for 4 prompts x 30
    tokens on the 1B model)."""
    screen = _screen(monkeypatch)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("the fox\nthe dog\nquick\n")
    assert main(["generate", str(checkpoint), "--prompt-file", str(prompts), "--batch-size",
                 "2", "--max-new-tokens", "4", "--temperature", "0"]) == 0
    shown = screen.getvalue()
    assert _counts(shown, "prefilled", "block") == ["1/2", "2/2"] * 2  # two batches
    assert _counts(shown, "generated", "token") == ["1/4", "2/4", "3/4", "4/4"] * 2
    assert shown.index("generated 4/4 tokens") < shown.index("=== prompt 1/3")


def test_float16_packing_is_counted(checkpoint: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--weights float16 rounds, then packs every matrix: 44 s for the 1B model, with
    nothing on the screen until '[float16 weights packed in 44.1 s]'."""
    screen = _screen(monkeypatch)
    from attnlab.model.decode import check_float16_weights

    try:
        check_float16_weights(GPT(GPTConfig.from_name("nano")).eval())
    except ValueError as err:  # not an x86 CPU
        pytest.skip(str(err))
    assert main(["generate", str(checkpoint), "the fox", "--max-new-tokens", "2",
                 "--weights", "float16"]) == 0
    counts = _counts(screen.getvalue(), "float16 packing", "tensor")
    # nano: 2 layers of q, k, v, out, fc, proj, and the head: 13 rounded, then 13 packed
    assert counts[:1] == ["1/26"] and counts[-1:] == ["26/26"] and len(counts) == 13 + 2 + 1
    assert screen.getvalue().index("26/26") < screen.getvalue().index("[float16 weights")


def test_heads_counts_its_trace_and_lens_its_rows(
        checkpoint: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """heads' detectors trace the probe in one pass (48 s on the 1B model), lens reads
    every layer's residual through the head (51 s): both were silent."""
    screen = _screen(monkeypatch)
    assert main(["heads", str(checkpoint), "the quick fox the quick fox",
                 "--out", str(tmp_path / "heads")]) == 0
    # the trace ends inside the last block, after the attention weights the detectors read
    assert _counts(screen.getvalue(), "traced", "block") == ["1/2"]
    screen.seek(0)
    screen.truncate()
    assert main(["lens", str(checkpoint), "the fox", "--out", str(tmp_path / "lens")]) == 0
    shown = screen.getvalue()
    assert _counts(shown, "traced", "block") == ["1/2", "2/2"]
    assert _counts(shown, "read", "row") == ["1/3", "2/3", "3/3"]  # emb, layer 0, layer 1
    assert shown.index("read 3/3 rows") < shown.index("position token")


def test_inspect_counts_its_figures_and_attention_json_in_a_log(
        checkpoint: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A log got "drawing N figures" and then nothing for minutes (the bar was a terminal's
    alone); attention.json (600 MB for the 1B model over 400 tokens) took 35 s unsaid."""
    screen = _screen(monkeypatch)
    assert main(["inspect", str(checkpoint), "the fox", "--out", str(tmp_path / "inspect"),
                 "--format", "png,svg,pdf"]) \
        == 0
    shown = screen.getvalue()
    # the grid, 4 heads' weights and rows; the grid first, one figure that takes longest
    assert "drawing  9 figures as png, svg, pdf (first the grid of 4 heads)\n" in shown
    assert _counts(shown, "drew", "figure") == [f"{i}/9" for i in range(1, 10)]
    assert _counts(shown, "wrote attention.json", "head") == ["1/4", "2/4", "3/4", "4/4"]
    assert shown.index("drew 9/9") < shown.index("4/4 heads") < shown.index("text     7 tokens")


def _weight_bytes(directory: Path) -> int:
    """The tensor data the safetensors files in `directory` hold."""
    from attnlab.model.tensorfile import read_header

    return sum(info.nbytes for path in directory.glob("*.safetensors")
               for info in read_header(path).values())


def _bytes_counted(shown: str, total: int) -> None:
    """Byte counts that rise, more than one of them, to `total`."""
    counts = [tuple(map(int, c.split("/"))) for c in _counts(shown, "wrote", "byte")]
    assert len(counts) > 1 and {t for _, t in counts} == {total}, shown
    done = [d for d, _ in counts]
    assert done == sorted(set(done)) and done[-1] == total


def test_export_says_what_it_writes_and_counts_its_shards_bytes(
        checkpoint: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A 1B model's 4.9 GB took 10 s to write after the load's bar, with nothing shown."""
    screen = _screen(monkeypatch)
    from attnlab.cli import export as export_cli

    monkeypatch.setattr(export_cli, "WRITING_LINE_BYTES", 1, raising=False)
    assert main(["export", str(checkpoint), str(tmp_path / "hf"), "--max_shard_size",
                 "10kB"]) == 0
    shown = screen.getvalue()
    line = re.search(r"^writing  [\d.]+ kB of weights as (\d) files$", shown, flags=re.M)
    assert line is not None, shown
    shards = int(line.group(1))
    assert shards > 1 and len(list((tmp_path / "hf").glob("model-*-of-*.safetensors"))) == shards
    _bytes_counted(shown, _weight_bytes(tmp_path / "hf"))
    assert shown.index("wrote ") < shown.index("wrote    ")  # the count, then the files


def test_export_to_one_file_counts_its_bytes_as_it_writes(
        checkpoint: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """One model.safetensors (the default, for any model under 5 GB) was written by one
    call: 11 s for a 1.2B model with nothing on the screen after "writing 2.5 GB"."""
    screen = _screen(monkeypatch)
    assert main(["export", str(checkpoint), str(tmp_path / "hf")]) == 0
    assert sorted(p.name for p in (tmp_path / "hf").glob("*.safetensors")) == [
        "model.safetensors"]
    _bytes_counted(screen.getvalue(), _weight_bytes(tmp_path / "hf"))


def test_patch_counts_its_runs_block_by_block(
        checkpoint: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """patch's bar moved once per pass of up to 32 patched runs: on a 1B model on a CPU a
    pass is one long forward pass, so the bar sat still for as long. Now the runs of a pass
    count as its blocks finish: nano's 2 blocks, so half of a pass's runs after the first
    (a pass restarting at layer 1 runs only the second)."""
    screen = _screen(monkeypatch)
    assert main(["patch", str(checkpoint), "--clean", "the fox", "--corrupt", "the dog",
                 "--answer", " ", "--wrong", "o", "--out", str(tmp_path / "patch")]) == 0
    counts = [tuple(map(int, c.split("/"))) for c in _counts(screen.getvalue(), "patched",
                                                             "run")]
    runs = counts[-1][1]  # 2 layers x 2 heads, and 2 layers x 7 positions of the residual
    assert runs == 2 * 2 + 2 * 7 and counts[-1] == (runs, runs)
    # one pass of all 18 from layer 0: 9 after its first block, all once scored
    assert counts == [(9, runs), (runs, runs)]
