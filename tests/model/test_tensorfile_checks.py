"""Safetensors headers read without trusting them, at their edges (mutation
testing, round 3). Files are written byte by byte here, so each case is exactly one flaw."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest
import torch

from attnlab.model.tensorfile import TensorFiles, read_header, read_tensor


def _write(path: Path, header: dict[str, Any], data: bytes, length_delta: int = 0) -> Path:
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text) + length_delta) + text + data)
    return path


def _f32(*values: float) -> bytes:
    return struct.pack(f"<{len(values)}f", *values)


def test_offsets_count_from_the_end_of_the_header(tmp_path: Path) -> None:
    header = {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
              "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]},
              "__metadata__": {"format": "pt"}}
    infos = read_header(_write(tmp_path / "m.safetensors", header, _f32(1.5, -2.0, 3.25)))
    assert set(infos) == {"a", "b"}
    assert torch.equal(read_tensor(infos["a"]), torch.tensor([1.5, -2.0]))
    assert torch.equal(read_tensor(infos["b"]), torch.tensor([3.25]))
    assert infos["b"].start - infos["a"].start == 8 and infos["b"].nbytes == 4


def test_a_header_length_one_byte_past_the_file_is_refused(tmp_path: Path) -> None:
    path = _write(tmp_path / "m.safetensors", {}, b"", length_delta=1)
    with pytest.raises(ValueError, match=r"its header claims 3 bytes but the file is 10 bytes"):
        read_header(path)


def test_a_header_over_the_limit_is_named_as_such(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A whole header longer than MAX_HEADER is refused for its size (it was called a
    truncated file, though the file held all of it)."""
    from attnlab.model import tensorfile

    path = _write(tmp_path / "m.safetensors", {"__metadata__": {"format": "pt"}}, b"")
    monkeypatch.setattr(tensorfile, "MAX_HEADER", 8)
    with pytest.raises(ValueError, match=r"its header is \d+ bytes, over safetensors' limit "
                                         r"of 8; the file is not one this reads"):
        read_header(path)


def test_data_that_ends_past_the_file_is_refused_from_the_header(tmp_path: Path) -> None:
    """A file cut inside its data, however little: refused before a tensor is read."""
    header = {"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}
    path = _write(tmp_path / "m.safetensors", header, _f32(1, 2, 3, 4)[:-1])
    with pytest.raises(ValueError, match=r"tensor 'a': its data ends at byte .*, past the end"):
        read_header(path)
    _write(path, header, _f32(1, 2, 3, 4))  # ending exactly at the end of the file: fine
    assert read_header(path)["a"].nbytes == 16


def test_an_empty_tensor_is_a_tensor(tmp_path: Path) -> None:
    header = {"empty": {"dtype": "F32", "shape": [0, 3], "data_offsets": [4, 4]},
              "a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}
    infos = read_header(_write(tmp_path / "m.safetensors", header, _f32(7)))
    assert read_tensor(infos["empty"]).shape == (0, 3)


def test_tensors_that_share_some_bytes_are_refused(tmp_path: Path) -> None:
    header = {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
              "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}
    path = _write(tmp_path / "m.safetensors", header, _f32(1, 2, 3))
    with pytest.raises(ValueError, match=r"tensors 'a' and 'b' share bytes"):
        read_header(path)


@pytest.mark.parametrize("shape", [[True, 4], [4, False], [-1, -1, 4], [2.0, 2]])
def test_a_shape_of_anything_but_counts_is_refused(tmp_path: Path, shape: list[Any]) -> None:
    header = {"a": {"dtype": "F32", "shape": shape, "data_offsets": [0, 16]}}
    path = _write(tmp_path / "m.safetensors", header, _f32(1, 2, 3, 4))
    with pytest.raises(ValueError, match=r"tensor 'a' has shape .*a shape is a list of counts"):
        read_header(path)


def test_a_tensor_in_two_shards_is_refused(tmp_path: Path) -> None:
    header = {"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}
    one = _write(tmp_path / "one.safetensors", header, _f32(1))
    two = _write(tmp_path / "two.safetensors", header, _f32(2))
    with pytest.raises(ValueError, match=r"tensor 'a' is in both one\.safetensors and "
                                         r"two\.safetensors"):
        TensorFiles([one, two])


def test_bf16_is_bfloat16_of_two_bytes(tmp_path: Path) -> None:
    value = torch.tensor([1.0, -3.5], dtype=torch.bfloat16)
    header = {"a": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]}}
    infos = read_header(_write(tmp_path / "m.safetensors", header,
                               value.view(torch.int16).numpy().tobytes()))
    assert torch.equal(read_tensor(infos["a"]), value)


@pytest.mark.parametrize(("field", "value"), [("norm_eps", float("inf")),
                                              ("attn_scale", float("nan")),
                                              ("init_std", float("-inf"))])
def test_a_checkpoint_config_with_a_non_finite_number_is_refused(
        tmp_path: Path, field: str, value: float) -> None:
    """JSON that Python writes and reads back (NaN, Infinity) is damage, named by field."""
    from attnlab import GPT, GPTConfig
    from attnlab.checkpoint import save_checkpoint
    from attnlab.load import load_checkpoint
    from attnlab.tokenizers import get_tokenizer

    tok = get_tokenizer("char", "abc")
    path = save_checkpoint(tmp_path / "ckpt", GPT(GPTConfig.from_name(
        "nano", vocab_size=tok.vocab_size)), tok)
    blob = json.loads((path / "config.json").read_text())
    blob["model"][field] = value
    (path / "config.json").write_text(json.dumps(blob))
    with pytest.raises(ValueError, match=rf"not a valid attnlab config .*GPTConfig\.{field}="):
        load_checkpoint(path)


def test_rows_read_alone_equal_the_tensors_slices_and_same_rows_compares_in_slices(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from attnlab.model import tensorfile
    from attnlab.model.tensorfile import read_rows, same_rows

    values = [float(i) for i in range(12)]
    header = {"a": {"dtype": "F32", "shape": [4, 3], "data_offsets": [0, 48]},
              "b": {"dtype": "F32", "shape": [4, 3], "data_offsets": [48, 96]},
              "c": {"dtype": "F32", "shape": [3, 4], "data_offsets": [96, 144]}}
    changed = [*values[:11], 99.0]  # b differs from a in its last row only
    infos = read_header(_write(tmp_path / "m.safetensors", header,
                               _f32(*values, *changed, *values)))
    whole = read_tensor(infos["a"])
    assert torch.equal(read_rows(infos["a"], 1, 3), whole[1:3])
    assert read_rows(infos["a"], 2, 2).shape == (0, 3)
    with pytest.raises(ValueError, match=r"rows 3\.\.5 of tensor 'a' \(4, 3\): expected"):
        read_rows(infos["a"], 3, 5)
    monkeypatch.setattr(tensorfile, "COMPARE_PIECE", 12)  # one row of each at a time
    assert same_rows(infos["a"], infos["a"]) and not same_rows(infos["a"], infos["b"])
    assert not same_rows(infos["a"], infos["c"])  # the same values, another shape


def test_data_offsets_spanning_more_bytes_than_the_shape_are_refused(tmp_path: Path) -> None:
    """A span too long is as wrong as one too short: the reader would take the shape's bytes
    and leave the rest, so the next tensor's data might be what the header says it is not."""
    header = {"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 8]}}
    path = _write(tmp_path / "m.safetensors", header, _f32(1, 2))
    with pytest.raises(ValueError, match=r"tensor 'a' is F32 \(1,\), 4 bytes, but its "
                                         r"data_offsets span 8 bytes"):
        read_header(path)


def test_a_header_listing_tensors_out_of_offset_order_is_read(tmp_path: Path) -> None:
    """Overlaps are looked for in offset order, not the header's (a header is a JSON table in
    any order): tensors listed after one stored later are not taken for overlapping it."""
    header = {"late": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]},
              "early": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}
    infos = read_header(_write(tmp_path / "m.safetensors", header, _f32(1, 2, 3, 4)))
    assert torch.equal(read_tensor(infos["early"]), torch.tensor([1.0, 2.0]))
    assert torch.equal(read_tensor(infos["late"]), torch.tensor([3.0, 4.0]))


def test_a_file_cut_short_after_its_header_was_read_is_an_error_not_zeros(
        tmp_path: Path) -> None:
    """The header is checked against the file's size once; a file replaced or truncated
    before a tensor is read must fail that read, not return a tensor half of whose bytes
    were never read."""
    header = {"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}
    path = _write(tmp_path / "m.safetensors", header, _f32(1, 2, 3, 4))
    info = read_header(path)["a"]
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size - 6)
    with pytest.raises(ValueError, match=r"ended inside tensor 'a'"):
        read_tensor(info)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16,
                                   torch.bfloat16, torch.int64, torch.int32, torch.int16,
                                   torch.int8, torch.uint8, torch.bool])
def test_every_dtype_safetensors_writes_reads_back_as_itself(
        tmp_path: Path, dtype: torch.dtype) -> None:
    """The dtype table against safetensors' own writer: a name mapped to another dtype of
    the same size (F16 read as bfloat16) keeps the byte counts right and every value wrong."""
    from safetensors.torch import save_file

    value = (torch.arange(-3, 5) * 1.25).to(dtype)  # values each dtype holds differently
    save_file({"a": value}, str(tmp_path / "m.safetensors"))
    got = TensorFiles([tmp_path / "m.safetensors"])["a"]
    assert got.dtype == dtype and torch.equal(got, value)
