"""`attnlab heads | patch | lens` and `generate --ablate`, in-process, on a checkpoint built
here (a random model with the copy task's tokenizer; nothing is trained: the trained
model's causal proof is tests/test_causal_proof.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from attnlab import GPT, GPTConfig
from attnlab.checkpoint import save_checkpoint
from attnlab.cli import heads as heads_cli
from attnlab.cli import main
from attnlab.cli import patch as patch_cli
from attnlab.generate import generate_text
from attnlab.interp.edits import ablate
from attnlab.train.data import load_dataset


@pytest.fixture
def checkpoint(tmp_path: Path) -> tuple[Path, GPT, object]:
    tokenizer = load_dataset("copy").tokenizer
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=tokenizer.vocab_size, block_size=16, n_layer=2, n_head=2,
                       n_embd=16, init_std=0.3)
    model = GPT(config).eval()
    path = save_checkpoint(tmp_path / "ckpt", model, tokenizer, meta={"dataset": "copy"})
    return path, model, tokenizer


def test_heads_table_figure_json_and_ablation(
    checkpoint: tuple, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = checkpoint[0]
    with monkeypatch.context() as m:  # the random model's best induction score is 0.04
        m.setattr(heads_cli, "MIN_INDUCTION", 0.0)
        assert main(["heads", str(path), "--out", str(tmp_path / "h")]) == 0
    out = capsys.readouterr().out
    assert "probe: 16 examples of the copy task" in out
    assert "held-out answer accuracy (256 examples): intact" in out
    report = json.loads((tmp_path / "h" / "heads.json").read_text())
    assert len(report["induction_ranking"]) == 4
    assert set(report["scores"]) == {"previous_token", "duplicate_token", "induction",
                                     "first_token"}
    assert 0 <= report["ablation"]["top_ablated"] <= 1
    assert (tmp_path / "h" / "heads.png").stat().st_size > 5000
    assert main(["heads", str(path), "abcabc", "--no-ablation", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "probe: the text (6 tokens)" in out and "accuracy" not in out
    # a probe without repeats has no induction heads: nothing to ablate, and the top and the
    # lowest heads never overlap
    assert main(["heads", str(path), "ab", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "no induction heads on this probe (best score 0.000 < 0.1)" in out
    assert "accuracy" not in out
    report = json.loads((tmp_path / "heads.json").read_text())
    assert report["ablation"] == {"skipped": "best induction score 0.000 < 0.1"}


def test_heads_says_when_a_checkpoint_names_no_task_to_probe_with(
    checkpoint: tuple, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    """An exported Hugging Face copy of a copy-task model ranked its heads on random repeats,
    not on the task's examples, without a word of it."""
    _, model, tokenizer = checkpoint
    bare = save_checkpoint(tmp_path / "bare", model, tokenizer)  # no meta: as a HF directory
    assert main(["heads", str(bare), "--out", str(tmp_path / "h")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "probe: 8 random sequences of 8 tokens, each repeated"
    assert lines[1].startswith(f"note:  {bare} records no data it was trained on")
    assert main(["heads", str(checkpoint[0]), "--out", str(tmp_path / "h")]) == 0
    assert "note:" not in capsys.readouterr().out  # the copy task's examples, said above


def test_heads_on_one_token_says_how_many_it_needs(
    checkpoint: tuple, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["heads", str(checkpoint[0]), "a", "--out", str(tmp_path)]) == 1
    assert capsys.readouterr().err == (
        "attnlab heads: error: the probe text 'a' is 1 token; head detectors need at least 2 "
        "tokens (a query and a key before it): give a longer text, or none for the standard "
        "probe\n")


def test_the_standard_probe_is_the_one_detect_heads_scores_on_by_default() -> None:
    from attnlab.interp.heads import detect_heads, standard_probe

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=12, block_size=10, n_layer=1, n_head=2, n_embd=8)).eval()
    assert standard_probe(model.config, 3).shape == (8, 10)  # 5 ids, repeated
    for name, scores in detect_heads(model, seed=3).items():
        torch.testing.assert_close(scores, detect_heads(
            model, standard_probe(model.config, 3))[name], rtol=0, atol=0)


@pytest.mark.parametrize("command", ["heads", "lens", "inspect"])
def test_text_longer_than_the_model_reads_is_refused_not_cut(
    command: str, checkpoint: tuple, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    """19 tokens for a block_size of 16: refused, naming both; not silently cut to 16."""
    path = checkpoint[0]
    assert main([command, str(path), "qhdkwzpa|qhdkwzpaqq", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "is 19 tokens, the model reads at most block_size=16; shorten it" in err
    assert main([command, str(path), "", "--out", str(tmp_path)]) == 1
    assert "has no tokens; pass some text" in capsys.readouterr().err


def test_patch_and_lens(checkpoint: tuple, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                        monkeypatch: pytest.MonkeyPatch) -> None:
    path, _, _ = checkpoint
    args = ["patch", str(path), "--clean", "abcd|ab", "--corrupt", "abxd|ab", "--answer", "c",
            "--wrong", "x", "--out", str(tmp_path / "p")]
    with monkeypatch.context() as m:
        m.setattr(patch_cli, "SMALL_GAP", 1e9)
        assert main(args) == 0
    out, err = capsys.readouterr()
    assert "logit difference 'c' - 'x'" in out and "residual entering layer 1" in out
    assert "warning: the clean and corrupted runs differ by only" in err
    with monkeypatch.context() as m:
        m.setattr(patch_cli, "SMALL_GAP", 0.0)
        assert main(args) == 0
    assert "warning" not in capsys.readouterr().err
    result = json.loads((tmp_path / "p" / "patch.json").read_text())
    assert len(result["heads"]) == 2 and len(result["resid"][0]) == 7
    assert result["resid"][0][:2] == [0.0, 0.0]  # positions where clean == corrupt
    assert result["resid"][0][2] == pytest.approx(1.0)  # the only changed input, entering layer 0
    assert "heads_by_position" not in result
    assert main([*args, "--by-position"]) == 0
    assert "heads at one position: " in capsys.readouterr().out
    by_position = json.loads((tmp_path / "p" / "patch.json").read_text())["heads_by_position"]
    assert [len(by_position), len(by_position[0]), len(by_position[0][0])] == [2, 2, 7]
    assert main([*args, "--by-position", "--method", "attribution"]) == 0  # estimated
    assert "heads at one position: " in capsys.readouterr().out
    assert main([*args, "--blocks"]) == 0
    out = capsys.readouterr().out
    assert "attention output of layer 1: " in out and "MLP output of layer 0: " in out
    blocks = json.loads((tmp_path / "p" / "patch.json").read_text())
    assert [len(blocks["attn_out"]), len(blocks["mlp_out"][0])] == [2, 7]
    assert blocks["resid"] == result["resid"]
    assert main([*args, "--blocks", "--method", "attribution"]) == 0
    assert "MLP output of layer 0: " in capsys.readouterr().out
    estimated = json.loads((tmp_path / "p" / "patch.json").read_text())
    assert estimated["method"] == "attribution" and len(estimated["mlp_out"][0]) == 7
    assert main(["lens", str(path), "abcd|ab", "--out", str(tmp_path / "l")]) == 0
    lens = json.loads((tmp_path / "l" / "lens.json").read_text())
    assert lens["layers"] == ["emb", "layer 0", "layer 1"] and len(lens["top_tokens"][0]) == 7
    assert (tmp_path / "l" / "lens.png").stat().st_size > 5000
    assert main(["lens", str(path), "abcd|ab", "--mid", "--out", str(tmp_path / "m")]) == 0
    mid = json.loads((tmp_path / "m" / "lens.json").read_text())
    assert mid["layers"] == ["emb", "layer 0 attn", "layer 0", "layer 1 attn", "layer 1"]
    assert mid["top_tokens"][::2] == lens["top_tokens"]
    assert "layer 0 attn" in capsys.readouterr().out
    assert main(["patch", str(path), "--clean", "abc", "--corrupt", "ab", "--answer", "c",
                 "--wrong", "x"]) == 1
    assert "same token length" in capsys.readouterr().err
    long = "qhdkwzpa|qhdkwzpaqq"  # 19 tokens for a block_size of 16, as heads/lens/inspect
    assert main(["patch", str(path), "--clean", long, "--corrupt", long, "--answer", "c",
                 "--wrong", "x"]) == 1
    assert "--clean is 19 tokens, the model reads at most block_size=16" in (
        capsys.readouterr().err)
    assert main(["patch", str(path), "--clean", "", "--corrupt", "", "--answer", "c",
                 "--wrong", "x"]) == 1
    assert "--clean has no tokens; pass some text" in capsys.readouterr().err
    assert main(["patch", str(path), "--clean", "abc", "--corrupt", "abd", "--answer", "cd",
                 "--wrong", "x"]) == 1
    assert "give exactly one token" in capsys.readouterr().err


def test_generate_with_heads_ablated(checkpoint: tuple,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    path, model, tokenizer = checkpoint
    args = ["generate", str(path), "abcd|", "--temperature", "0", "--max-new-tokens", "6",
            "--ablate", "1.0,0.1,0.0,1.1"]
    assert main(args) == 0
    expected = generate_text(model, tokenizer, ["abcd|"], max_new_tokens=6, temperature=0,
                             edits=ablate([(1, 0), (0, 1), (0, 0), (1, 1)]))[0]
    plain = generate_text(model, tokenizer, ["abcd|"], max_new_tokens=6, temperature=0)[0]
    assert capsys.readouterr().out == "abcd|" + expected + "\n" and expected != plain
    assert main(["generate", str(path), "ab", "--ablate", "2.0"]) == 1
    assert "(layer, head) (2, 0) do not exist" in capsys.readouterr().err
    assert main(["generate", str(path), "ab", "--ablate", "x"]) == 1
    assert "LAYER.HEAD" in capsys.readouterr().err
    assert main(["generate", str(path), "ab", "--ablate", ""]) == 1  # ablated nothing before
    assert "bad head '' in ''" in capsys.readouterr().err


def test_patch_reads_escapes_in_the_answer_as_generate_reads_stops(
    checkpoint: tuple, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from attnlab.cli.common import CLIError, unescape

    assert unescape(r"a\nb\tc") == "a\nb\tc" and unescape("plain") == "plain"
    seen: list[str] = []

    def one_token(tok: object, text: str, flag: str) -> int:
        seen.append(text)
        raise CLIError("stop here")

    monkeypatch.setattr(patch_cli, "_one_token", one_token)
    assert main(["patch", str(checkpoint[0]), "--clean", "abc", "--corrupt", "abd",
                 "--answer", r"\n", "--wrong", r"\t", "--out", str(tmp_path)]) == 1
    assert seen == ["\n"]  # the newline itself, not a backslash and an n


def test_patch_by_attribution(checkpoint: tuple, tmp_path: Path,
                              capsys: pytest.CaptureFixture[str]) -> None:
    path, _, _ = checkpoint
    args = ["patch", str(path), "--clean", "abcd|ab", "--corrupt", "abxd|ab", "--answer", "c",
            "--wrong", "x", "--method", "attribution", "--out", str(tmp_path / "p")]
    assert main(args) == 0
    assert "heads by effect (first-order estimates): " in capsys.readouterr().out
    result = json.loads((tmp_path / "p" / "patch.json").read_text())
    assert result["method"] == "attribution"
    assert result["resid"][0][:2] == [0.0, 0.0]  # positions where clean == corrupt
    assert result["resid"][0][2] != 0.0 and len(result["heads"]) == 2


def test_patch_attribution_figure_says_attribution(
        checkpoint: tuple, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--method attribution` writes first-order estimates: its figure must not be titled
    activation patching (it was, whichever method ran)."""
    import attnlab.viz as viz

    path, _, _ = checkpoint
    titles: dict[str, str] = {}  # by file name: the figure is drawn into a hidden stage
    save = viz.save_figure

    def keep_title(fig, *args, **kwargs):  # type: ignore[no-untyped-def]
        titles[Path(args[0]).name] = fig._suptitle.get_text()
        return save(fig, *args, **kwargs)

    monkeypatch.setattr(viz, "save_figure", keep_title)
    monkeypatch.setattr(patch_cli, "SMALL_GAP", 0.0)
    for method in ("activation", "attribution"):
        out = tmp_path / method
        assert main(["patch", str(path), "--clean", "abcd|ab", "--corrupt", "abxd|ab",
                     "--answer", "c", "--wrong", "x", "--method", method,
                     "--out", str(out)]) == 0
        assert json.loads((out / "patch.json").read_text())["method"] == method
        assert titles.pop("patch.png").startswith(f"{method} patching")


def test_patch_help_names_both_methods(capsys: pytest.CaptureFixture[str]) -> None:
    # `attnlab --help` listed patch as "activation patching" only, and `patch --help`'s
    # description never said what --method attribution does
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "activation or attribution patching" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["patch", "--help"])
    assert "first order from one backward pass);" in " ".join(capsys.readouterr().out.split())


def test_lens_mid_on_a_parallel_residual_model_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tokenizer = load_dataset("copy").tokenizer
    config = GPTConfig(vocab_size=tokenizer.vocab_size, block_size=16, n_layer=1, n_head=2,
                       n_embd=16, parallel_residual=True)
    path = save_checkpoint(tmp_path / "ckpt", GPT(config), tokenizer)
    assert main(["lens", str(path), "abc|", "--mid", "--out", str(tmp_path / "l")]) == 1
    err = capsys.readouterr().err
    assert "--mid reads each layer between its attention and its MLP, and this model has " \
           "nothing there, as its MLP reads resid_pre (parallel_residual=True); leave out " \
           "--mid" in err
    assert not (tmp_path / "l").exists()
    assert main(["lens", str(path), "abc|", "--out", str(tmp_path / "l")]) == 0


@pytest.mark.parametrize("method", ["activation", "attribution"])
def test_patch_qkv_prints_records_and_draws_each_heads_inputs(
    checkpoint: tuple, tmp_path: Path, capsys: pytest.CaptureFixture[str], method: str
) -> None:
    """--qkv adds each head's queries, keys, values and attention weights: a line of the five
    largest effects each, the library's grids in patch.json (the other grids unchanged) and a
    grid each in the figure."""
    from attnlab.interp import patching

    path, model, tokenizer = checkpoint
    args = ["patch", str(path), "--clean", "abcd|ab", "--corrupt", "abxd|ab", "--answer", "c",
            "--wrong", "x", "--method", method]
    assert main([*args, "--out", str(tmp_path / "plain")]) == 0
    capsys.readouterr()
    assert main([*args, "--qkv", "--out", str(tmp_path / "qkv")]) == 0
    out = capsys.readouterr().out
    for what in ("queries", "keys", "values", "attention weights"):
        line = next(line for line in out.splitlines() if line.startswith(f"  through {what}:"))
        assert len(line.split(", ")) == 4  # 2 layers x 2 heads, all shown
    plain = json.loads((tmp_path / "plain" / "patch.json").read_text())
    record = json.loads((tmp_path / "qkv" / "patch.json").read_text())
    for grid in ("heads", "resid"):  # the clean run's weights take the explicit path: 1e-5
        assert torch.tensor(record[grid]) == pytest.approx(torch.tensor(plain[grid]), abs=1e-4)
    ids = [tokenizer.encode(text) for text in ("abcd|ab", "abxd|ab")]
    clean, corrupt = (torch.tensor([row]) for row in ids)  # (1, T) each
    metric = patching.logit_diff_metric(*(tokenizer.encode(t)[0] for t in "cx"))
    expected = getattr(patching, f"{method}_patching")(model, clean, corrupt, metric, qkv=True)
    for name in ("q", "k", "v", "attn_weights"):
        assert record[name] == getattr(expected, name).tolist(), name
        assert name not in plain
    from PIL import Image
    with Image.open(tmp_path / "qkv" / "patch.png") as qkv, \
            Image.open(tmp_path / "plain" / "patch.png") as without:
        assert qkv.size[1] > without.size[1]  # four more grids under the heads'


def test_patch_paths_to_heads_or_the_logits(
    checkpoint: tuple, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--paths-to adds path patching: a line of senders, the library's grid in patch.json
    (null where no path starts) and a grid in the figure; bad receivers, inputs and methods
    are refused before any run."""
    from attnlab.interp.patching import logit_diff_metric
    from attnlab.interp.paths import path_patching

    path, model, tokenizer = checkpoint
    args = ["patch", str(path), "--clean", "abcd|ab", "--corrupt", "abxd|ab", "--answer", "c",
            "--wrong", "x", "--out", str(tmp_path / "p")]
    clean, corrupt = (torch.tensor([tokenizer.encode(t)]) for t in ("abcd|ab", "abxd|ab"))
    metric = logit_diff_metric(*(tokenizer.encode(t)[0] for t in "cx"))
    for receivers, flags, title in [([(1, 0)], ["--paths-to", "1.0", "--via", "q"],
                                     "paths to 1.0 via q"),
                                    (None, ["--paths-to", "logits"], "paths to the logits")]:
        assert main([*args, *flags]) == 0
        line = next(line for line in capsys.readouterr().out.splitlines()
                    if line.startswith(f"{title}: senders by effect: "))
        expected = path_patching(model, clean, corrupt, metric, receivers,
                                 via="q" if receivers else None).senders
        record = json.loads((tmp_path / "p" / "patch.json").read_text())["paths"]
        assert record["receivers"] == ([list(r) for r in receivers] if receivers else None)
        senders = [[float("nan") if e is None else e for e in row] for row in record["senders"]]
        torch.testing.assert_close(torch.tensor(senders, dtype=expected.dtype), expected,
                                   equal_nan=True)
        assert len(line.split(", ")) == (2 if receivers else 4)  # NaN cells left out
    assert record["senders"][1] != [None, None]  # to the logits, layer 1 sends too
    refused = [(["--paths-to", "1.0", "--method", "attribution"], "--method activation only"),
               (["--paths-to", "0.1"], "--paths-to: receivers [(0, 1)] are all in layer 0"),
               (["--paths-to", "2.0"], "--paths-to: (layer, head) (2, 0) do not exist"),
               (["--paths-to", "one"], "--paths-to: bad head 'one'"),
               (["--paths-to", "1.1", "--via", "q,z"], "--via q,z: via=['q', 'z']: a path ends"),
               (["--paths-to", "logits", "--via", "q"], "--paths-to logits has no receivers"),
               (["--via", "q"], "--via q goes with --paths-to")]
    for flags, message in refused:
        assert main([*args, *flags]) == 1
        assert message in capsys.readouterr().err, flags


def test_the_printout_ranks_effects_by_size_and_prints_no_minus_zero() -> None:
    """`_top`: the five cells largest in size, either sign (a head against the answer among
    them), NaN cells (no path) left out, each "layer.head" ("@position" for a position grid)
    with its signed effect; what rounds to zero prints +0.00 from either side, not -0.00."""
    nan = float("nan")
    grid = torch.tensor([[0.1, -0.9, nan], [0.5, -0.004, 0.3], [0.2, 0.0, -0.6]])  # (3, 3)
    assert patch_cli._top(grid) == "0.1 -0.90, 2.2 -0.60, 1.0 +0.50, 1.2 +0.30, 2.0 +0.20"
    by_position = torch.tensor([[[0.25, -0.001], [nan, -0.5]]])  # (1, 2, 2)
    assert patch_cli._top(by_position) == "0.1@1 -0.50, 0.0@0 +0.25, 0.0@1 +0.00"
    assert [patch_cli._signed(e) for e in (-0.004, -0.0, 0.0, 0.25, -1.25)] == [
        "+0.00", "+0.00", "+0.00", "+0.25", "-1.25"]


@pytest.mark.parametrize("grouped", [True, False])
def test_the_printout_says_keys_and_values_are_key_value_heads_when_grouped(
    grouped: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    """--qkv on a grouped-query model: its keys and values belong to key-value heads (2
    columns for 4 query heads), and their lines say so; queries and attention weights, per
    query head, and every line of an ungrouped model do not."""
    from attnlab.interp.patching import Patching

    k, v = torch.tensor([[0.1, 0.2], [0.3, 0.4]]), torch.tensor([[0.0, -0.7], [0.0, 0.0]])
    result = Patching(heads=torch.zeros(2, 4), resid=torch.zeros(2, 3), clean=1.0,
                      corrupted=0.0, q=torch.zeros(2, 4), k=k, v=v,
                      attn_weights=torch.zeros(2, 4))
    patch_cli._print_effects(result, patch_cli.METHODS["activation"], grouped)
    lines = capsys.readouterr().out.splitlines()
    shared = " (key-value heads)" if grouped else ""
    assert f"  through keys{shared}: 1.1 +0.40, 1.0 +0.30, 0.1 +0.20, 0.0 +0.10" in lines
    assert any(line.startswith(f"  through values{shared}: 0.1 -0.70, ") for line in lines)
    assert any(line.startswith("  through queries: ") for line in lines)
    assert any(line.startswith("  through attention weights: ") for line in lines)


def test_patch_paths_through_several_inputs_are_titled_recorded_and_drawn(
    checkpoint: tuple, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """--paths-to 1.0,1.1 --via k,v patches both inputs named (the library's grid with
    via=("k", "v")), and the printout, patch.json and the figure's grid (handed to
    plot_patching) name them; a receiver in layer 0 beside a later one is taken."""
    import attnlab.viz.heads as viz_heads
    from attnlab.interp.patching import logit_diff_metric
    from attnlab.interp.paths import path_patching

    drawn: dict[str, torch.Tensor] = {}
    plot = viz_heads.plot_patching

    def keep_inputs(*args: object, **kwargs: object) -> object:
        drawn.update(kwargs.get("inputs") or {})  # type: ignore[call-overload]
        return plot(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(viz_heads, "plot_patching", keep_inputs)
    path, model, tokenizer = checkpoint
    args = ["patch", str(path), "--clean", "abcd|ab", "--corrupt", "abxd|ab", "--answer", "c",
            "--wrong", "x", "--out", str(tmp_path / "p")]
    clean, corrupt = (torch.tensor([tokenizer.encode(t)]) for t in ("abcd|ab", "abxd|ab"))
    metric = logit_diff_metric(*(tokenizer.encode(t)[0] for t in "cx"))
    assert main([*args, "--paths-to", "1.0,1.1", "--via", "k,v"]) == 0
    title = "paths to 1.0,1.1 via k,v"
    assert any(line.startswith(f"{title}: senders by effect: ")
               for line in capsys.readouterr().out.splitlines())
    expected = path_patching(model, clean, corrupt, metric, [(1, 0), (1, 1)],
                             via=("k", "v")).senders  # (2, 2): layer 1 NaN
    only_k = path_patching(model, clean, corrupt, metric, [(1, 0), (1, 1)], via="k").senders
    assert (expected[0] - only_k[0]).abs().max() > 1e-4  # the values' paths count
    record = json.loads((tmp_path / "p" / "patch.json").read_text())["paths"]
    assert record["via"] == ["k", "v"] and record["receivers"] == [[1, 0], [1, 1]]
    torch.testing.assert_close(torch.tensor(record["senders"][0], dtype=expected.dtype),
                               expected[0])
    assert list(drawn) == [title]
    torch.testing.assert_close(drawn[title], expected, equal_nan=True)
    assert main([*args, "--paths-to", "0.1,1.0"]) == 0
    record = json.loads((tmp_path / "p" / "patch.json").read_text())["paths"]
    assert record["receivers"] == [[0, 1], [1, 0]]
