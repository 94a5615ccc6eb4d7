"""`attnlab export --overwrite` over an earlier export: what OUT holds afterwards, and after a
Ctrl-C halfway (cli/export.py, cli/outputs.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from attnlab import GPT, GPTConfig
from attnlab.checkpoint import save_checkpoint
from attnlab.cli import main
from attnlab.load import load_checkpoint
from attnlab.tokenizers import get_tokenizer


def _checkpoint(directory: Path, text: str, seed: int) -> Path:
    tok = get_tokenizer("char", text)
    torch.manual_seed(seed)
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, block_size=16, n_layer=1, n_head=2,
                          n_embd=16, pos="rope", norm="rmsnorm", mlp="swiglu", bias=False))
    return save_checkpoint(directory, model.eval(), tok)


def _files(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())}


def test_an_export_over_another_replaces_its_tokenizer_and_its_stale_files(
        tmp_path: Path) -> None:
    """--overwrite kept the earlier export's tokenizer.json (write_hf_dir wrote none where
    one was there), so the new weights read the old model's ids; and it left the earlier
    export's other files (another tokenizer's vocab.json, shards of another count). Files
    an export never writes stay."""
    first = _checkpoint(tmp_path / "first", "abcdefgh ", 0)
    second = _checkpoint(tmp_path / "second", "zyx wvu", 1)
    out = tmp_path / "hf"
    assert main(["export", str(first), str(out)]) == 0
    for name in ("vocab.json", "merges.txt", "model-00001-of-00002.safetensors", "notes.txt"):
        (out / name).write_text("an earlier export's" if name != "notes.txt" else "mine")
    assert main(["export", str(second), str(out), "--overwrite"]) == 0
    assert sorted(_files(out)) == ["config.json", "model.safetensors", "notes.txt",
                                   "tokenizer.json", "tokenizer_config.json"]
    loaded, wanted = load_checkpoint(out), load_checkpoint(second)
    assert loaded.tokenizer.encode("zyx wvu") == wanted.tokenizer.encode("zyx wvu")
    assert loaded.tokenizer.vocab_size == wanted.tokenizer.vocab_size
    for a, b in zip(loaded.model.state_dict().values(), wanted.model.state_dict().values(),
                    strict=True):
        assert torch.equal(a, b)


def test_an_export_stopped_halfway_leaves_the_earlier_export_whole(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """--overwrite wrote into OUT in place: a Ctrl-C after the new weights left them beside
    the earlier export's config and tokenizer. Now OUT is the earlier export, byte for byte,
    and no stage is left."""
    import attnlab.hf as hf

    first = _checkpoint(tmp_path / "first", "abcdefgh ", 0)
    second = _checkpoint(tmp_path / "second", "zyx wvu", 1)
    out = tmp_path / "hf"
    assert main(["export", str(first), str(out)]) == 0
    before = _files(out)
    real = hf.save_hf

    def stopped(path: Path, *args: object, **kwargs: object) -> Path:
        real(path, *args, **kwargs)  # type: ignore[arg-type]
        (Path(path) / "config.json").unlink()  # halfway: the weights, not yet the config
        raise KeyboardInterrupt

    monkeypatch.setattr(hf, "save_hf", stopped)
    capsys.readouterr()
    assert main(["export", str(second), str(out), "--overwrite"]) == 130
    assert capsys.readouterr().err == "attnlab export: interrupted\n"
    assert _files(out) == before


def test_save_hf_over_an_earlier_export_writes_its_own_tokenizer(tmp_path: Path) -> None:
    """save_hf wrote no tokenizer.json where one was there, so a directory saved again with
    another tokenizer kept the first one's (and its tokenizer_config.json)."""
    from attnlab import save_hf

    first = load_checkpoint(_checkpoint(tmp_path / "first", "abcdefgh ", 0))
    second = load_checkpoint(_checkpoint(tmp_path / "second", "zyx wvu", 1))
    save_hf(tmp_path / "hf", first.model, first.tokenizer)
    save_hf(tmp_path / "hf", second.model, second.tokenizer)
    assert load_checkpoint(tmp_path / "hf").tokenizer.encode("zyx wvu") == \
        second.tokenizer.encode("zyx wvu")
