"""`attnlab demo` and `attnlab inspect`, run in-process through the CLI entry point."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
import torch

from attnlab import GPT, GPTConfig
from attnlab.checkpoint import save_checkpoint
from attnlab.cli import main
from attnlab.cli.inspect import WHAT
from attnlab.tokenizers import CharTokenizer
from helpers import nano_checkpoint

pytest.importorskip("matplotlib")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return nano_checkpoint(tmp_path_factory.mktemp("ckpt"), "abcdefghijklmnopqrstuvwxyz .")


def test_demo_hello_predicts_world_and_reuses_its_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["demo", "hello", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "'Hello' -> ' World'" in out and "✓" in out
    assert "trained in" in out
    for phase in ("before", "after"):
        for figure in ("embeddings", "qkv", "attention"):
            assert (tmp_path / f"{phase}_{figure}.png").stat().st_size > 10_000
    assert main(["demo", "hello", "--out", str(tmp_path), "--no-figures"]) == 0
    out = capsys.readouterr().out
    assert "reused" in out and "' World'" in out and "figures" not in out
    assert torch.get_num_threads() >= 1  # the demo's one-thread setting was undone


def test_demo_dtype_trains_under_autocast_in_its_own_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """demo took no --dtype, though every command that trains or runs a model does."""
    import attnlab.train.loop

    trained = []
    real = attnlab.train.loop.train

    def recorded(model: object, config: object, *args: object, **kwargs: object) -> object:
        trained.append(config)
        return real(model, config, *args, **kwargs)

    monkeypatch.setattr(attnlab.train.loop, "train", recorded)
    monkeypatch.chdir(tmp_path)
    assert main(["demo", "hello", "--dtype", "bfloat16", "--no-figures"]) == 0
    assert [c.dtype for c in trained] == ["bfloat16"]  # type: ignore[attr-defined]
    assert "bfloat16 autocast: trained in" in capsys.readouterr().out
    assert (tmp_path / "attnlab-demo" / "hello-bfloat16" / "ckpt").is_dir()
    assert main(["demo", "averaging", "--dtype", "bfloat16"]) == 1
    assert "--dtype bfloat16 applies to hello and animals" in capsys.readouterr().err


def test_demo_animals_prints_a_check_per_sentence(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import attnlab.train.recipes

    real = attnlab.train.recipes.seed_experiment

    def short(name: str, dataset: object = None) -> tuple:  # 60 steps: the check, not the result
        model, config, data = real(name)
        return model, dataclasses.replace(config, max_iters=60, eval_interval=60), data

    monkeypatch.setattr(attnlab.train.recipes, "seed_experiment", short)
    assert main(["demo", "animals", "--out", str(tmp_path), "--no-figures"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.strip().startswith("'The ")]
    assert len(rows) == 6
    assert all(("noun ✓" in r or "noun ✗" in r) and "->" in r for r in rows)
    assert "noun has the largest weight in" in out and "/6 rows" in out
    assert not (tmp_path / "after_sentences.png").exists()
    # another seed trains into its own folder: the recipe's checkpoint stays
    monkeypatch.chdir(tmp_path)
    assert main(["demo", "animals", "--seed", "5", "--no-figures"]) == 0
    assert "seed 5" in capsys.readouterr().out
    assert sorted(p.name for p in (tmp_path / "attnlab-demo").iterdir()) == ["animals-seed5"]
    # another recipe's checkpoint in --out is not silently trained over
    assert main(["demo", "hello", "--out", str(tmp_path), "--no-figures"]) == 1
    assert "holds a model of another recipe" in capsys.readouterr().err
    assert main(["demo", "hello", "--out", str(tmp_path), "--no-figures", "--retrain"]) == 0


def test_demo_averaging_forms_agree(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "averaging", "--out", str(tmp_path), "--format", "svg"]) == 0
    out = capsys.readouterr().out
    assert out.count("✓") == 3 and "✗" not in out and "agree" in out
    assert "0.125 0.125 0.125 0.125 0.125 0.125 0.125 0.125" in out
    assert "<svg" in (tmp_path / "averaging_weights.svg").read_text()[:1000]


def test_demo_refuses_what_it_would_ignore_before_training(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # a bad format failed only after training; --seed on averaging was silently ignored
    from attnlab.cli import demo

    monkeypatch.setattr(demo, "_seed_002", lambda *a: pytest.fail("trained first"))
    assert main(["demo", "hello", "--out", str(tmp_path), "--format", "jpg"]) == 1
    assert "--format jpg: choose from png, svg, pdf" in capsys.readouterr().err
    assert main(["demo", "averaging", "--out", str(tmp_path), "--seed", "3"]) == 1
    assert "--seed applies to hello and animals" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())
    from attnlab.viz.save import FORMATS

    assert demo.FIGURE_FORMATS == FORMATS  # kept apart only so --help imports no matplotlib


def test_inspect_writes_figures_and_json(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = "the cat sat."
    code = main(["inspect", str(checkpoint), text, "--out", str(tmp_path), "--what", "all",
                 "--layer", "1", "--head", "1", "--query", "4"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    printed = captured.out
    assert "12 tokens" in printed and "kB" in printed
    assert "drawing" not in captured.err  # 8 figures: no progress to show
    names = {p.name for p in tmp_path.iterdir()}
    expected = {f"{kind}_L1_H1.png" for kind in ("weights", "scores", "masked", "steps", "qkv")}
    expected |= {"row_L1_H1_q4.png", "grid.png", "embeddings.png", "attention.json"}
    assert names == expected
    assert all((tmp_path / n).stat().st_size > 5_000 for n in names if n.endswith(".png"))

    record = json.loads((tmp_path / "attention.json").read_text())
    assert record["tokens"] == list(text) and record["text"] == text
    assert record["layers"] == [1] and record["heads"] == [1]
    (entry,) = record["attention"]
    assert (entry["layer"], entry["head"]) == (1, 1)
    weights = torch.tensor(entry["weights"])  # (T, T)
    assert weights.shape == (12, 12)
    torch.testing.assert_close(weights.sum(-1), torch.ones(12), atol=1e-4, rtol=0)
    past = torch.tril(torch.ones(12, 12, dtype=torch.bool))
    assert torch.all(weights[~past] == 0)  # future cells exactly 0
    assert torch.all(weights[past] > 0)


def test_inspect_of_one_row_traces_that_row_alone(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--what row alone keeps the --query's row of the weights (Trace(rows=...): no (T, T)
    weights, so long texts too): attention.json holds (1, T) per head, equal to that row of a
    whole trace's, and says which row ("query_rows"); the same figures are drawn."""
    runs = {}
    for what in ("row", "weights,row"):
        out = tmp_path / what
        assert main(["inspect", str(checkpoint), "the cat sat.", "--out", str(out), "--what",
                     what, "--layer", "1", "--query", "-3"]) == 0
        runs[what] = json.loads((out / "attention.json").read_text())
        assert (out / "row_L1_H0_q9.png").is_file() and (out / "row_L1_H1_q9.png").is_file()
    capsys.readouterr()
    alone, whole = runs["row"], runs["weights,row"]
    assert alone["query_rows"] == [9] and "query_rows" not in whole
    for one, every in zip(alone["attention"], whole["attention"], strict=True):
        assert torch.tensor(one["weights"]).shape == (1, 12)
        torch.testing.assert_close(torch.tensor(one["weights"]),
                                   torch.tensor(every["weights"])[9:10], atol=1e-6, rtol=0)


def test_inspect_into_the_same_out_removes_the_earlier_runs_figures_only(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A second text into the same --out left the first text's figures beside the new JSON;
    the files an earlier inspect listed are removed, anything else in the directory stays."""
    (tmp_path / "notes.png").write_bytes(b"mine")
    assert main(["inspect", str(checkpoint), "the cat sat.", "--out", str(tmp_path),
                 "--what", "weights,row", "--layer", "0", "--head", "0,1", "--query", "9"]) == 0
    assert (tmp_path / "row_L0_H1_q9.png").is_file()
    capsys.readouterr()
    assert main(["inspect", str(checkpoint), "the", "--out", str(tmp_path), "--what",
                 "weights", "--layer", "0", "--head", "0"]) == 0
    assert "removed  3 files an earlier inspect wrote" in capsys.readouterr().out
    names = {p.name for p in tmp_path.iterdir()}
    assert names == {"weights_L0_H0.png", "attention.json", "notes.png"}
    record = json.loads((tmp_path / "attention.json").read_text())
    assert record["files"] == ["weights_L0_H0.png"] and record["text"] == "the"


def test_inspect_says_how_many_figures_it_draws_when_they_are_many(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # all kinds of every head took 15 s for GPT-2 with nothing on the screen
    assert main(["inspect", str(checkpoint), "the cat", "--out", str(tmp_path), "--what",
                 "weights,scores,masked,qkv", "--format", "png,svg"]) == 0
    assert "drawing  16 figures as png, svg" in capsys.readouterr().err
    assert len(list(tmp_path.glob("*.svg"))) == 16


def test_inspect_builds_one_figure_per_kind_and_draws_each_file_once(
    checkpoint: Path, tmp_path: Path
) -> None:
    """`inspect --what all` on 48 tokens took 42 s: every head's figures were built anew, and
    savefig(bbox_inches="tight") drew each file twice. Now one figure per kind is refilled
    head after head and drawn whole once; later heads paste its token axes (viz_save)."""
    from matplotlib.figure import Figure

    with mock.patch.object(Figure, "__init__", autospec=True,
                           side_effect=Figure.__init__) as built, \
            mock.patch.object(Figure, "draw", autospec=True, side_effect=Figure.draw) as drawn:
        assert main(["inspect", str(checkpoint), "the cat", "--out", str(tmp_path),
                     "--what", "all", "--layer", "1"]) == 0
    files = list(tmp_path.glob("*.png"))
    assert len(files) == 2 + 6 * 2  # grid, embeddings, 6 kinds x 2 heads
    kinds = len(WHAT) - 1  # all but experts, a mixture of experts' alone
    assert built.call_count == kinds
    assert drawn.call_count == kinds  # the second head's file pastes the first's axes


@pytest.mark.parametrize("chosen", [[0, 1, 2, 3], [2, 3], [1, 3]])
def test_inspect_qkv_of_grouped_query_heads_shows_the_key_value_head_they_read(
    tmp_path: Path, chosen: list[int]
) -> None:
    """With 4 query heads over 2 key/value heads, --what qkv indexed k and v by query head:
    IndexError for heads 2 and 3 (Llama, Qwen, Mistral directories all failed)."""
    from attnlab import viz
    from attnlab.model.trace import Trace

    tok = CharTokenizer(sorted(set("abcdefgh ")))
    torch.manual_seed(0)
    model = GPT(GPTConfig.from_name("nano", vocab_size=tok.vocab_size, block_size=16,
                                    n_head=4, n_kv_head=2)).eval()
    path = save_checkpoint(tmp_path / "ckpt", model, tok)
    shown: list[tuple[torch.Tensor, ...]] = []
    plot_qkv = viz.plot_qkv

    def spy(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *args: object,
            **kwargs: object) -> object:
        shown.append((q, k, v, kwargs["title"]))
        return plot_qkv(q, k, v, *args, **kwargs)  # type: ignore[arg-type]

    with mock.patch.object(viz, "plot_qkv", spy):
        assert main(["inspect", str(path), "abc deh", "--out", str(tmp_path / "out"),
                     "--what", "qkv", "--layer", "1",
                     "--head", ",".join(map(str, chosen))]) == 0
    trace = Trace(names=["q", "k", "v"])
    with torch.no_grad():
        model(torch.tensor([tok.encode("abc deh")]), trace=trace)
    assert len(shown) == len(chosen)
    for h, (q, k, v, title) in zip(chosen, shown, strict=True):
        assert torch.equal(q, trace.get("q", 1)[0, h])
        assert torch.equal(k, trace.get("k", 1)[0, h // 2])  # heads 0-1 read 0, 2-3 read 1
        assert torch.equal(v, trace.get("v", 1)[0, h // 2])
        assert f"key/value head {h // 2}, read by heads {h // 2 * 2}-{h // 2 * 2 + 1}" in title


def test_inspect_hatches_the_keys_outside_a_sliding_window(tmp_path: Path) -> None:
    """On a model with a window of 3 keys in layer 1 only (Qwen2-style window_layers) the
    figures hatched only the future: keys before the window were cells and bars of weight
    0, though no query saw them. Layer 0 keeps the whole causal past."""
    import numpy as np

    from attnlab import viz
    tok = CharTokenizer(sorted(set("abcdefghijklmnopqrstuvwxyz .")))
    torch.manual_seed(0)
    model = GPT(GPTConfig.from_name("nano", vocab_size=tok.vocab_size, block_size=32,
                                    sliding_window=3, window_layers=[1])).eval()
    path = save_checkpoint(tmp_path / "ckpt", model, tok)
    drawn: dict[str, list[object]] = {}
    save_figure = viz.save_figure

    def spy(fig: object, stem: Path, *args: object, **kwargs: object) -> object:
        drawn[stem.name] = [  # each image's hidden cells (the grid: one per panel on one
            # Axes), or a row's hatched bands
            drawing for ax in fig.axes if ax.images or ax.containers  # type: ignore[attr-defined]
            for drawing in ([np.ma.getmaskarray(image.get_array()) for image in ax.images]
                            or [sorted((p.get_x(), p.get_x() + p.get_width())
                                       for p in ax.patches if p.get_gid() == "masked")])]
        return save_figure(fig, stem, *args, **kwargs)  # type: ignore[arg-type]

    with mock.patch.object(viz, "save_figure", spy):
        assert main(["inspect", str(path), "the cat sat.", "--out", str(tmp_path / "out"),
                     "--what", "all", "--head", "0"]) == 0
    causal = np.tril(np.ones((12, 12), dtype=bool))
    window = causal & ~np.tril(np.ones((12, 12), dtype=bool), -3)  # keys i-2..i
    for la, may in ((0, causal), (1, window)):
        assert all((hidden == ~may).all() for hidden in drawn[f"weights_L{la}_H0"])
        assert all((hidden == ~may).all() for hidden in drawn[f"masked_L{la}_H0"])
        raw, masked, weights = drawn[f"steps_L{la}_H0"]
        assert not raw.any() and (masked == ~may).all() and (weights == ~may).all(), la
        assert (drawn["grid"][la] == ~may).all(), la
    assert not (window == causal).all()  # the window hides keys the future does not
    assert drawn["row_L0_H0_q11"] == [[]]  # the last query sees every key in layer 0
    assert drawn["row_L1_H0_q11"] == [[(-0.5, 8.5)]]  # keys 0..8: before its window
    drawn.clear()  # the same bands from a trace of the last row alone (--what row)
    with mock.patch.object(viz, "save_figure", spy):
        assert main(["inspect", str(path), "the cat sat.", "--out", str(tmp_path / "row"),
                     "--what", "row", "--head", "0"]) == 0
    assert drawn == {"row_L0_H0_q11": [[]], "row_L1_H0_q11": [[(-0.5, 8.5)]]}


def test_inspect_help_lists_every_kind(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["inspect", "--help"])
    help_text = capsys.readouterr().out
    for kind in WHAT:
        assert f"  {kind} " in help_text


@pytest.mark.parametrize(
    "flags, message",
    [(["--layer", "5"], "--layer [5] out of range: the model has 2"),
     (["--what", "weights,bogus"], "unknown ['bogus']"),
     (["--query", "99"], "--query 99 out of range for 3 tokens")],
)
def test_inspect_bad_flags_name_the_fix(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str],
    message: str,
) -> None:
    assert main(["inspect", str(checkpoint), "abc", "--out", str(tmp_path), *flags]) == 1
    assert message in capsys.readouterr().err


def test_inspect_out_naming_a_file_says_so(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # --out FILE gave "[Errno 17] File exists"
    (tmp_path / "figures.png").write_bytes(b"")
    assert main(["inspect", str(checkpoint), "abc", "--out", str(tmp_path / "figures.png")]) == 1
    err = capsys.readouterr().err
    assert "figures.png is a file; give a directory (it is created if missing)" in err
    assert "Errno" not in err


def test_a_closed_pipe_ends_the_command_quietly() -> None:
    """`attnlab heads ... | head -3`: the reader left; no "error: [Errno 32] Broken pipe".
    A subprocess: the handler points the process's stdout at /dev/null."""
    script = (
        "import attnlab.cli.demo as demo\n"
        "from attnlab.cli import main\n"
        "def reader_gone(args):\n"
        "    print('a line')\n"
        "    raise BrokenPipeError(32, 'Broken pipe')\n"
        "demo.run = reader_gone\n"
        "raise SystemExit(main(['demo', 'averaging']))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert (done.returncode, done.stderr) == (141, "")


def test_inspect_summary_draws_the_heads_overview_without_weights(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = "the cat sat on the mat."
    code = main(["inspect", str(checkpoint), text, "--out", str(tmp_path), "--summary",
                 "--format", "png,html"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert {p.name for p in tmp_path.iterdir()} == {"summary.png", "summary.html",
                                                    "summary.json"}
    assert (tmp_path / "summary.png").stat().st_size > 5_000
    record = json.loads((tmp_path / "summary.json").read_text())
    assert record["layers"] == [0, 1] and record["heads"] == [0, 1]
    assert set(record["means"]) == {"attn_entropy", "attn_sink", "attn_distance", "attn_max"}
    out = captured.out
    assert "no T x T" in out and "attn_weights" not in out
    sink = torch.tensor(record["means"]["attn_sink"])  # (layers, heads)
    (best_layer, best_head, best) = record["extremes"][0]["heads"][0]
    assert record["extremes"][0]["what"] == "most weight on the first token"
    assert best == pytest.approx(sink.max().item()) and sink[best_layer, best_head] == sink.max()
    assert f"{best_layer}.{best_head} {best:.3f}" in out
    # one layer and head: the figure and the record hold that one
    code = main(["inspect", str(checkpoint), text, "--out", str(tmp_path / "one"), "--summary",
                 "--layer", "1", "--head", "0"])
    assert code == 0
    record = json.loads((tmp_path / "one" / "summary.json").read_text())
    assert record["layers"] == [1] and record["heads"] == [0]
    assert torch.tensor(record["means"]["attn_entropy"]).shape == (1, 1)
    capsys.readouterr()
    code = main(["inspect", str(checkpoint), text, "--out", str(tmp_path), "--summary",
                 "--query", "3"])
    assert code != 0 and "--summary averages over every query row" in capsys.readouterr().err
