"""`write_tensors`: safetensors files written a piece at a time, read back by safetensors'
own reader as the tensors given (the export's weights used safetensors' `save_file`, which
wrote a 1B model's 2 GB in one silent call)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from attnlab.model import tensorfile
from attnlab.model.tensorfile import read_header, write_tensors


def _tensors() -> dict[str, torch.Tensor]:
    """Every layout the export hands over: dtypes of 1, 2 and 4 bytes, a transposed view,
    two views of one storage (save_file refuses those), a scalar and an empty tensor."""
    generator = torch.Generator().manual_seed(0)
    table = torch.randn(6, 4, generator=generator)
    return {
        "layers.1.weight": table.t(),  # (4, 6), not contiguous
        "layers.0.weight": table,  # the same storage as the view above
        "half": torch.randn(3, 5, generator=generator).to(torch.bfloat16),
        "mask": torch.tensor([True, False, True]),
        "scale": torch.tensor(2.5, dtype=torch.float16),
        "none": torch.zeros(0, 7),
        "ids": torch.arange(5, dtype=torch.int64),
    }


def test_safetensors_reads_back_the_tensors_and_metadata(tmp_path: Path) -> None:
    from safetensors import safe_open
    from safetensors.torch import load_file

    tensors = _tensors()
    path = tmp_path / "model.safetensors"
    written = write_tensors(path, tensors, {"format": "pt"})
    assert written == sum(t.numel() * t.element_size() for t in tensors.values())
    loaded = load_file(str(path))
    assert set(loaded) == set(tensors)
    for name, tensor in tensors.items():
        assert loaded[name].dtype == tensor.dtype and torch.equal(loaded[name], tensor), name
    with safe_open(str(path), framework="pt") as f:
        assert f.metadata() == {"format": "pt"}
    # in the order given (a reader reading layer by layer reads the file front to back)
    assert [info.name for info in sorted(read_header(path).values(),
                                         key=lambda i: i.start)] == list(tensors)
    # the data starts 8-byte aligned, after the header, as save_file writes it
    assert (path.stat().st_size - written) % 8 == 0


def test_progress_counts_each_piece_up_to_the_bytes_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tensorfile, "WRITE_PIECE", 16)
    tensors = {"big": torch.arange(10, dtype=torch.float32),  # 40 bytes: pieces of 16, 16, 8
               "small": torch.ones(2, dtype=torch.float16)}  # 4 bytes
    calls: list[int] = []
    assert write_tensors(tmp_path / "m.safetensors", tensors, {}, calls.append) == 44
    assert calls == [16, 32, 40, 44]


def test_a_dtype_safetensors_has_no_name_for_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"tensor 'z' is torch.complex64; safetensors holds "
                                         r".*torch.bfloat16.*: convert it first"):
        write_tensors(tmp_path / "m.safetensors", {"z": torch.zeros(2, dtype=torch.complex64)},
                      {})
    assert not (tmp_path / "m.safetensors").exists()
