"""What `attnlab inspect` writes into --out (cli/inspect_files.py): attention.json written a
few query rows at a time is the text the whole record's `json.dumps` gave, byte for byte; the
files list is rewritten without formatting the weights again, and read back from the end."""

from __future__ import annotations

import io
import json
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
import torch

import attnlab.cli.inspect_files as inspect_files
from attnlab import viz
from attnlab.cli import main
from attnlab.cli.inspect_files import AttentionRecord, earlier_files, rewrite_files
from attnlab.load import open_checkpoint
from attnlab.model.trace import Trace
from helpers import nano_checkpoint


def _weights(R: int, S: int, seed: int) -> torch.Tensor:
    """(R, S) weights with what a float's repr spells in every way: 0, 1, exponents (5e-06
    rounds to 1e-05), long float32 tails."""
    g = torch.Generator().manual_seed(seed)
    w = torch.softmax(torch.randn(R, S, generator=g) * 4, -1)  # (R, S)
    w[0, :3] = torch.tensor([0.0, 1.0, 5e-6])
    return w


def _dumped(fields: dict[str, Any], weights: dict[tuple[int, int], torch.Tensor],
            files: list[str]) -> bytes:
    """attention.json as inspect wrote it before: the whole record as Python lists, then
    one json.dumps (cli/inspect.py's `_record` and `_move_in` of commit ba98730)."""
    record = {**fields, "attention": [{"layer": la, "head": h, "weights": viz.to_list(w)}
                                      for (la, h), w in weights.items()]}
    record["files"] = sorted(files)
    return json.dumps(record).encode()


@pytest.mark.parametrize("rows_bytes", [inspect_files.ROWS_BYTES, 3 * 4 * 7, 1])
def test_attention_json_is_the_whole_records_json_dumps_byte_for_byte(
        rows_bytes: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever the pieces a head is cut into (ROWS_BYTES: the default, 3 rows of 7 keys,
    one row), and for a row-only record with non-ASCII tokens and a quote in its text."""
    monkeypatch.setattr(inspect_files, "ROWS_BYTES", rows_bytes)
    for R, S, extra in [(7, 7, {}), (1, 7, {"query_rows": [4]})]:
        layers, heads = [0, 2], [1, 3, 5]
        weights = {(la, h): _weights(R, S, seed=10 * la + h) for la in layers for h in heads}
        fields = {**extra, "checkpoint": "runs/x", "text": 'a "files": [b] ü', "tokens":
                  ["a", " \"", "ü\n"], "token_ids": [1, 2, 3], "layers": layers, "heads": heads}
        record = AttentionRecord(fields, layers, heads, lambda la, h, w=weights: w[(la, h)])
        file = io.BytesIO()
        tail_at = record.write(file, ["weights_L0_H1.png", "grid.png"])
        expected = _dumped(fields, weights, ["weights_L0_H1.png", "grid.png"])
        assert file.getvalue() == expected
        assert json.loads(file.getvalue()) == json.loads(expected)
        assert file.getvalue()[tail_at:] == b', "files": ["grid.png", "weights_L0_H1.png"]}'


def test_a_bfloat16_trace_is_written_as_its_float32_values() -> None:
    w = _weights(5, 5, seed=1).bfloat16()
    record = AttentionRecord({"text": "x"}, [0], [0], lambda la, h: w)
    file = io.BytesIO()
    record.write(file, [])
    assert file.getvalue() == _dumped({"text": "x"}, {(0, 0): w}, [])


def test_the_files_list_is_rewritten_and_read_from_the_end(tmp_path: Path) -> None:
    """The second write (the earlier run's files removed) copies the weights' text, not
    formats it again; the next run reads the list from the file's end, where a text that
    spells the key inside a string cannot be taken for it."""
    w = _weights(300, 300, seed=2)
    fields = {"text": 'x, "files": ["../../etc"]}', "tokens": ['"files": [']}
    record = AttentionRecord(fields, [0], [0, 1], lambda la, h: w)
    first, second = tmp_path / "first.json", tmp_path / "second.json"
    with first.open("wb") as file:
        tail_at = record.write(file, ["old.png", "new.png"])
    assert earlier_files(first) == {"old.png", "new.png"}
    rewrite_files(first, second, tail_at, ["new.png"])
    assert second.read_bytes() == _dumped(fields, {(0, 0): w, (0, 1): w}, ["new.png"])
    assert earlier_files(second) == {"new.png"}
    tracemalloc.start()
    try:
        earlier_files(second)  # a 0.7 MB file: its weights are not parsed
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert second.stat().st_size > 500_000 and peak < 200_000, peak
    for bad in (b"", b"[1, 2]", b'{"files": "x.png"}', b'{"a": 1, "files": ["a/b.png"]}'):
        (tmp_path / "bad.json").write_bytes(bad)
        assert earlier_files(tmp_path / "bad.json") == set()


def test_inspects_attention_json_is_what_the_whole_record_gave(tmp_path: Path) -> None:
    """The command's attention.json, byte for byte, against the record built the earlier
    way from a trace of the same text."""
    ckpt = nano_checkpoint(tmp_path, "abcdefghijklmnopqrstuvwxyz .")
    text = "the cat sat on the mat."
    assert main(["inspect", str(ckpt), text, "--out", str(tmp_path / "out"), "--what", "grid",
                 "--head", "1,0"]) == 0
    model, tok = (loaded := open_checkpoint(ckpt).load()).model, loaded.tokenizer
    ids = tok.encode(text)
    c = model.config
    layers, heads = list(range(c.n_layer)), [0, 1]
    trace = Trace(layers=layers, heads=heads, names={"attn_weights"}).run(
        model, torch.tensor([ids]))
    fields = {"checkpoint": str(loaded.path), "text": text, "tokens": tok.token_texts(ids),
              "token_ids": ids, "layers": layers, "heads": heads}
    weights = {(la, h): trace.get("attn_weights", la)[0, h] for la in layers for h in heads}
    written = (tmp_path / "out" / "attention.json").read_bytes()
    assert written == _dumped(fields, weights, ["grid.png"])


def test_a_ctrl_c_among_the_moves_lands_after_the_last(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Ctrl-C between two of move_in's renames left the new attention.json beside the
    earlier run's figures; it is held until the set is whole, then raised."""
    import os
    import signal

    out, stage = tmp_path / "out", tmp_path / "stage"
    out.mkdir()
    stage.mkdir()
    for name in ("grid.png", "weights.png"):
        (stage / name).write_text("new")
        (out / name).write_text("old")
    real, moves = os.replace, []

    def replace(src: Any, dst: Any) -> None:
        moves.append(dst)
        if len(moves) == 2:  # attention.json is in, the figures not yet
            signal.raise_signal(signal.SIGINT)
        real(src, dst)

    monkeypatch.setattr(inspect_files.os, "replace", replace)
    record = AttentionRecord({"tokens": ["a"]}, [], [], lambda layer, head: None)
    with pytest.raises(KeyboardInterrupt):
        inspect_files.move_in(out, stage, record, ["grid.png", "weights.png"])
    assert [(out / name).read_text() for name in ("grid.png", "weights.png")] == ["new", "new"]
