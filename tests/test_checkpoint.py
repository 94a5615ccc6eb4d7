"""checkpoint.py's weights file: GPT's (in, out) weight layout survives a save and a load, and
files written before it (safetensors' save_model, row-major) still load."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file, save_model

from attnlab import GPT, GPTConfig
from attnlab.checkpoint import WEIGHTS_FILE, save_checkpoint
from attnlab.load import load_checkpoint
from attnlab.tokenizers import CharTokenizer
from helpers import linears_laid_out, make_row_major


def _model(tie: bool) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig.from_name("nano", tie_weights=tie)).eval()


def _assert_same_weights(a: GPT, b: GPT) -> None:
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert torch.equal(x, y), name


@pytest.mark.parametrize("tie", [True, False])
def test_round_trip_keeps_values_layout_and_tie(tie: bool, tmp_path: Path) -> None:
    model = _model(tie)
    assert linears_laid_out(model)
    path = save_checkpoint(tmp_path / "ckpt", model, CharTokenizer.from_text("abc"))
    with safe_open(str(path / WEIGHTS_FILE), "pt") as f:
        names = set(f.keys())
    assert ("wte.weight" in names) == (not tie) and "lm_head.weight" in names  # tied: once
    loaded = load_checkpoint(path).model
    _assert_same_weights(model, loaded)
    assert linears_laid_out(loaded) and (loaded.lm_head.weight is loaded.wte.weight) == tie


def test_loading_imports_no_compiler(tmp_path: Path) -> None:
    """load_checkpoint built the model on the meta device with its initial weights drawn
    there, through torch._refs, which imported torch._dynamo and sympy: 2.6 s of every
    command that loads a checkpoint (0.02 s without them)."""
    import subprocess
    import sys

    path = save_checkpoint(tmp_path / "ckpt", _model(True), CharTokenizer.from_text("abc"))
    code = ("import sys; from attnlab.load import load_checkpoint; "
            f"load_checkpoint({str(path)!r}); "
            "print([m for m in ('torch._dynamo', 'sympy') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("kept", ["lm_head.weight", "wte.weight"])
def test_row_major_files_load(kept: str, tmp_path: Path) -> None:
    """Checkpoints saved before GPT.lay_out_weights hold row-major weights, written by
    safetensors' save_model (which keeps the tied matrix as lm_head.weight); a file may also
    keep it as wte.weight."""
    model = _model(tie=True)
    path = save_checkpoint(tmp_path / "ckpt", model, CharTokenizer.from_text("abc"))
    old = _model(tie=True)
    make_row_major(old)
    if kept == "lm_head.weight":
        save_model(old, str(path / WEIGHTS_FILE))
    else:
        state = {k: v for k, v in old.state_dict().items() if k != "lm_head.weight"}
        save_file(state, str(path / WEIGHTS_FILE))
    with safe_open(str(path / WEIGHTS_FILE), "pt") as f:
        names = set(f.keys())
    assert {"lm_head.weight", "wte.weight"} & names == {kept}
    loaded = load_checkpoint(path).model
    _assert_same_weights(model, loaded)
    assert linears_laid_out(loaded) and loaded.lm_head.weight is loaded.wte.weight


def test_weights_of_another_config_are_summarised(tmp_path: Path) -> None:
    # torch's message listed every tensor (32 lines for a 2-layer model of another width)
    save_checkpoint(tmp_path / "ckpt", _model(True), CharTokenizer(list("abc")))
    config = tmp_path / "ckpt" / "config.json"
    config.write_text(config.read_text().replace('"n_embd": 16', '"n_embd": 32'))
    with pytest.raises(ValueError) as exc:
        load_checkpoint(tmp_path / "ckpt")
    message = str(exc.value)
    assert "\n" not in message and len(message) < 600, message
    assert "tensors have other shapes (file vs config: wte.weight (65, 16) vs (65, 32)" in message
    assert ", ...)" in message and "belongs to another config" in message


def test_a_run_directory_stands_for_its_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # `attnlab info runs/copy` said the run folder was not a checkpoint
    from attnlab.cli import main

    save_checkpoint(tmp_path / "run" / "ckpt", _model(True), CharTokenizer(list("abc")),
                    meta={"step": 3})
    assert load_checkpoint(tmp_path / "run").path == tmp_path / "run" / "ckpt"
    assert main(["info", str(tmp_path / "run")]) == 0
    assert f"checkpoint  {tmp_path / 'run' / 'ckpt'}" in capsys.readouterr().out
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"empty has no config\.json, so it holds no "
                       r"model: pass an attnlab checkpoint \(`attnlab train --out DIR` writes "
                       r"one to DIR/ckpt\) or a Hugging Face model directory"):
        load_checkpoint(tmp_path / "empty")


def test_configs_saved_before_the_family_switches_load(tmp_path: Path) -> None:
    # `"mlp": true` and `"layer_norm": true` (v0.1's spellings) failed the JSON type check
    # ("GPTConfig.mlp=True is not of type str") before GPTConfig could convert them
    save_checkpoint(tmp_path / "ckpt", _model(True), CharTokenizer(list("abc")))
    config = tmp_path / "ckpt" / "config.json"
    saved = json.loads(config.read_text())
    saved["model"]["mlp"] = True
    del saved["model"]["norm"]
    saved["model"]["layer_norm"] = True
    config.write_text(json.dumps(saved))
    loaded = load_checkpoint(tmp_path / "ckpt").model
    assert (loaded.config.mlp, loaded.config.norm) == ("gelu", "layernorm")
    saved["model"].update(mlp=False, layer_norm=False)
    assert GPTConfig.from_dict(saved["model"]).mlp == "none"
    assert GPTConfig.from_dict(saved["model"]).norm == "none"


def test_a_tokenizer_with_more_ids_than_the_model_is_refused_at_save_and_load(
    tmp_path: Path,
) -> None:
    """One check (tokenizers.check_fits) for save_checkpoint, load_checkpoint,
    load_hf_checkpoint, the server, generation and show: a tokenizer's ids past the model's
    vocab_size name no row."""
    from attnlab.viewer.app import create_app

    model = GPT(GPTConfig.from_name("nano", vocab_size=3)).eval()
    wide = CharTokenizer.from_text("abcd")  # 4 ids
    message = ("tokenizer 'char' has 4 ids but the model's vocab_size is 3: they belong to "
               "different models")
    with pytest.raises(ValueError, match=message):
        save_checkpoint(tmp_path / "ckpt", model, wide)
    assert not (tmp_path / "ckpt").exists()
    path = save_checkpoint(tmp_path / "ckpt", model, CharTokenizer.from_text("abc"))
    wide.save(path)  # a directory whose tokenizer another model's
    with pytest.raises(ValueError, match=message):
        load_checkpoint(path)
    pytest.importorskip("fastapi")
    with pytest.raises(ValueError, match=message):
        create_app(model, wide)


def test_a_read_racing_a_save_reads_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`attnlab generate` on a run that is training: a save moves the checkpoint aside and
    puts the new one in place (.ckpt.tmp-PID / .ckpt.old-PID beside it meanwhile), so a read
    can lose a file halfway; it reads again while those are there or when the directory
    changed during the read, and otherwise raises at once."""
    import attnlab.checkpoint as checkpoint
    import attnlab.model.tensorfile as tensorfile

    path = save_checkpoint(tmp_path / "ckpt", _model(True), CharTokenizer(list("abc")))
    calls: list[str] = []
    real = tensorfile.read_tensor

    def vanishing_once(info: tensorfile.TensorInfo) -> torch.Tensor:
        calls.append(info.name)
        if len(calls) == 1:
            raise FileNotFoundError(info.path)
        return real(info)

    monkeypatch.setattr(tensorfile, "read_tensor", vanishing_once)
    monkeypatch.setattr(checkpoint.time, "sleep", lambda seconds: None)
    saving = tmp_path / ".ckpt.tmp-999"
    saving.mkdir()
    loaded = load_checkpoint(path).model
    assert loaded.config == _model(True).config and calls.count(calls[0]) == 2
    saving.rmdir()
    calls.clear()
    with pytest.raises(FileNotFoundError):  # no save under way: raised at once
        load_checkpoint(path)
    assert len(calls) == 1  # no second read

    def removed(info: tensorfile.TensorInfo) -> torch.Tensor:
        info.path.unlink()
        raise OSError("No such file")

    monkeypatch.setattr(tensorfile, "read_tensor", removed)
    # the directory changed during the read, so it is read again, and found as it now is
    with pytest.raises(FileNotFoundError, match=r"has no model\.safetensors; the checkpoint "
                                                r"is incomplete"):
        load_checkpoint(path)


@pytest.mark.parametrize(("fields", "bad"), [
    (dict(sliding_window=4, window_layers=[1]), ("window_layers", ["1"])),
    (dict(pos="rope", rope_scaling={"rope_type": "linear", "factor": 2.0}),
     ("rope_scaling", ["linear", 2.0])),
])
def test_list_and_dict_config_fields_round_trip(
    fields: dict, bad: tuple[str, object], tmp_path: Path
) -> None:
    """window_layers (a list) and rope_scaling (a dict) were refused at load as corrupted:
    the JSON type check knew scalars only. A value of the wrong kind is still refused."""
    torch.manual_seed(0)
    model = GPT(GPTConfig.from_name("nano", **fields)).eval()
    path = save_checkpoint(tmp_path / "ckpt", model, CharTokenizer.from_text("abc"))
    loaded = load_checkpoint(path).model
    assert loaded.config == model.config
    _assert_same_weights(model, loaded)
    config = json.loads((path / "config.json").read_text())
    config["model"][bad[0]] = bad[1]
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=f"{bad[0]}=.* corrupted"):
        load_checkpoint(path)


@pytest.mark.parametrize("tie", [True, False])
def test_writer_saves_the_state_of_the_moment_it_was_called(tie: bool, tmp_path: Path) -> None:
    """CheckpointWriter copies before it returns: weights and train_state changed while the
    write runs (as the next training steps change them) reach neither file, and its files
    hold what `save_checkpoint`'s hold."""
    from attnlab.checkpoint import STATE_FILE, CheckpointWriter, load_train_state

    model, tok = _model(tie), CharTokenizer.from_text("abc")
    moment = {"step": 3, "moments": [torch.randn(4, 5).t(), {"m": torch.arange(6.0)}]}
    save_checkpoint(tmp_path / "sync", model, tok, train_state=moment, meta={"step": 3})
    writer = CheckpointWriter()
    path = writer.save(tmp_path / "async", model, tok, train_state=moment, meta={"step": 3})
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    moment["moments"][0].add_(1.0)
    moment["moments"][1]["m"].zero_()
    writer.wait()
    assert (path / "config.json").read_text() == (tmp_path / "sync" / "config.json").read_text()
    with safe_open(str(path / WEIGHTS_FILE), "pt") as a, \
            safe_open(str(tmp_path / "sync" / WEIGHTS_FILE), "pt") as b:
        names = a.keys()
        assert a.metadata() == b.metadata() and names == b.keys()
        for name in names:  # the header's order is safetensors' own: values, not bytes
            assert torch.equal(a.get_tensor(name), b.get_tensor(name)), name
    sync, written = load_train_state(tmp_path / "sync"), load_train_state(path)
    assert torch.equal(written["moments"][0], sync["moments"][0])
    assert torch.equal(written["moments"][1]["m"], torch.arange(6.0))
    assert (path / STATE_FILE).exists() and not list(tmp_path.glob(".async.*"))
    loaded = load_checkpoint(path).model
    _assert_same_weights(load_checkpoint(tmp_path / "sync").model, loaded)


def test_arguments_that_could_not_load_back_are_refused_by_name(tmp_path: Path) -> None:
    model, tok = GPT(GPTConfig.from_name("nano")).eval(), CharTokenizer.from_text("ab")
    with pytest.raises(TypeError, match=r"tokenizer is a NoneType; a checkpoint needs"):
        save_checkpoint(tmp_path, model, None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"directory is a GPT; pass a path first"):
        save_checkpoint(model, tmp_path, tok)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"model is a OrderedDict, not an attnlab GPT"):
        save_checkpoint(tmp_path, model.state_dict(), tok)  # type: ignore[arg-type]
    assert not any(tmp_path.iterdir())


def test_writer_raises_a_failed_write_at_wait(tmp_path: Path) -> None:
    """A write that fails on the writer's thread raises in the caller's at the next wait
    (or save), once; the writer then works again."""
    from attnlab.checkpoint import CheckpointWriter

    model, tok = _model(True), CharTokenizer.from_text("abc")
    (tmp_path / "file").write_text("not a directory")
    writer = CheckpointWriter()
    writer.save(tmp_path / "file" / "ckpt", model, tok)
    with pytest.raises(OSError):
        writer.wait()
    writer.wait()  # raised once
    writer.save(tmp_path / "ckpt", model, tok)
    writer.wait()
    _assert_same_weights(model, load_checkpoint(tmp_path / "ckpt").model)


def test_a_broken_config_says_what_is_broken(tmp_path: Path) -> None:
    model, tok = GPT(GPTConfig.from_name("nano")).eval(), CharTokenizer.from_text("ab")
    path = save_checkpoint(tmp_path / "ckpt", model, tok)
    config = path / "config.json"
    config.write_text('{"model_type": "llama", ')
    with pytest.raises(ValueError, match=r"config.json is not JSON \(.*\): the file is "
                                         r"truncated or corrupted"):
        load_checkpoint(path)
    config.write_text("{}")
    with pytest.raises(ValueError, match=r'has no "model" section, so it is neither'):
        load_checkpoint(path)
    with pytest.raises(NotADirectoryError, match=rf"is a file; .*: pass {path}$"):
        load_checkpoint(config)
    loose = tmp_path / "loose.txt"  # beside no checkpoint
    loose.write_text("not a checkpoint")
    with pytest.raises(NotADirectoryError, match=r"pass a directory holding config\.json"):
        load_checkpoint(loose)


def _held_writes(monkeypatch: pytest.MonkeyPatch, log: list[str], hold: float) -> None:
    """Make each of the writer's writes log its start and end, `hold` seconds apart."""
    import time

    from attnlab import checkpoint

    write = checkpoint._write

    def held(directory: Path, *args: object) -> Path:
        log.append(f"start {directory.name}")
        time.sleep(hold)
        done = write(directory, *args)  # type: ignore[arg-type]
        log.append(f"end {directory.name}")
        return done

    monkeypatch.setattr(checkpoint, "_write", held)


def test_writer_writes_one_checkpoint_at_a_time(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two writes of one directory at once would share its temporary directory and its
    renames: a second save waits until the first write is complete."""
    from attnlab.checkpoint import CheckpointWriter, read_config

    log: list[str] = []
    _held_writes(monkeypatch, log, hold=0.3)
    model, tok = _model(True), CharTokenizer.from_text("abc")
    writer = CheckpointWriter()
    writer.save(tmp_path / "ckpt", model, tok, meta={"step": 1})
    writer.save(tmp_path / "ckpt", model, tok, meta={"step": 2})
    writer.wait()
    assert log == ["start ckpt", "end ckpt", "start ckpt", "end ckpt"]
    assert read_config(tmp_path / "ckpt")[1] == {"step": 2}


def test_writer_saves_the_meta_of_the_moment_it_was_called(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """meta is copied before save returns, as the weights and train_state are: a list in it
    that the caller changes meanwhile (a history) reaches the file as it was."""
    from attnlab.checkpoint import CheckpointWriter, read_config

    _held_writes(monkeypatch, [], hold=0.3)
    meta = {"step": 3, "history": [{"step": 3, "loss": 1.5}]}
    writer = CheckpointWriter()
    writer.save(tmp_path / "ckpt", _model(True), CharTokenizer.from_text("abc"), meta=meta)
    meta["history"].append({"step": 4, "loss": 1.25})  # type: ignore[attr-defined]
    meta["step"] = 4
    writer.wait()
    assert read_config(tmp_path / "ckpt")[1] == {"step": 3, "history": [{"step": 3,
                                                                          "loss": 1.5}]}
