"""Safetensors files read without trusting them: the header is parsed and checked in full
before a byte of tensor data is read, and tensors are read one at a time, on request.

A safetensors file is an 8-byte little-endian header length N, N bytes of JSON
({name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}), then the
data; offsets count from the end of the header. `read_header` refuses, in one line naming
the file and the tensor, a header that runs past the file, JSON that is not such a table,
an unknown dtype, a byte count that disagrees with the shape, and data that runs past the
file or overlaps another tensor's. A shape may be huge (a 70B model's header describes
141 GB): nothing here allocates by the header's word. `TensorFiles` joins the headers of
a model's shards into one name -> tensor table, refusing a tensor found in two shards.
`write_tensors` writes such a file a piece at a time, saying how many bytes it has written.

This module knows files and bytes; which tensors a model needs and what they mean is the
loaders' (`model/materialize.py` builds a GPT from named tensors, `checkpoint.py` and `hf`
name them).
"""

from __future__ import annotations

import itertools
import json
import math
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch
from torch import Tensor

#: safetensors dtype names -> torch dtypes (the format's spec lists these)
DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
    "BF16": torch.bfloat16, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U8": torch.uint8, "BOOL": torch.bool,
}
_DTYPE_NAMES = {dtype: name for name, dtype in DTYPES.items()}
# safetensors' own reader refuses headers over 100 MB; a real one is well under 1 MB
MAX_HEADER = 100_000_000
# one read() returns at most ~2 GiB on Linux, so bigger tensors are read in pieces
_READ_PIECE = 1 << 30
#: bytes `write_tensors` writes between two calls of its progress: a 1B model's 2 GB
#: file in ~32 steps, each well under a second
WRITE_PIECE = 1 << 26
#: bytes of each tensor `same_rows` holds at a time: small beside any model it compares,
#: large enough that a read's own cost is lost in it
COMPARE_PIECE = 1 << 26


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lies: its file, dtype, shape and byte range (absolute offsets)."""

    name: str
    path: Path
    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int
    nbytes: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def read_header(path: Path) -> dict[str, TensorInfo]:
    """The tensors a safetensors file holds, by name, checked against the file's size;
    ValueError naming the file and what is wrong, before any tensor data is read."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise ValueError(f"{path} is {size} bytes, too short for a safetensors file "
                                 "(8-byte header length first); it is truncated or not one")
            (length,) = struct.unpack("<Q", head)
            if length > size - 8:
                raise ValueError(f"{path}: its header claims {length:,} bytes but the file is "
                                 f"{size:,} bytes; the file is truncated or not safetensors")
            if length > MAX_HEADER:  # safetensors' own limit: 100 MB
                raise ValueError(f"{path}: its header is {length:,} bytes, over safetensors' "
                                 f"limit of {MAX_HEADER:,}; the file is not one this reads")
            text = f.read(length)
    except OSError as err:
        raise ValueError(f"cannot read {path}: {err.strerror or err}") from err
    try:
        header = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: its header is not JSON ({err}); the file is corrupted or "
                         "not safetensors") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path}: its header is a JSON {type(header).__name__}, not the "
                         "table of tensors safetensors writes")
    header.pop("__metadata__", None)
    data_start = 8 + length
    infos = {name: _entry(path, name, entry, data_start, size)
             for name, entry in header.items()}
    _check_overlaps(path, infos.values())
    return infos


def _entry(path: Path, name: str, entry: object, data_start: int, size: int) -> TensorInfo:
    """One header entry as a TensorInfo, every field checked."""
    where = f"{path}: tensor {name!r}"
    if not isinstance(entry, dict):
        raise ValueError(f"{where} is described by {entry!r}, not a dtype/shape/offsets table")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if dtype not in DTYPES:
        raise ValueError(f"{where} has dtype {dtype!r}; safetensors dtypes are "
                         f"{', '.join(DTYPES)}")
    if not (isinstance(shape, list) and all(_count(n) for n in shape)):
        raise ValueError(f"{where} has shape {shape!r}; a shape is a list of counts >= 0")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(map(_count, offsets))
            and offsets[0] <= offsets[1]):
        raise ValueError(f"{where} has data_offsets {offsets!r}; expected [begin, end] with "
                         "0 <= begin <= end")
    begin, end = offsets
    itemsize = DTYPES[dtype].itemsize
    if end - begin != math.prod(shape) * itemsize:
        raise ValueError(f"{where} is {dtype} {tuple(shape)}, {math.prod(shape) * itemsize:,} "
                         f"bytes, but its data_offsets span {end - begin:,} bytes")
    if data_start + end > size:
        raise ValueError(f"{where}: its data ends at byte {data_start + end:,}, past the end "
                         f"of the {size:,}-byte file; the file is truncated")
    return TensorInfo(name, path, DTYPES[dtype], tuple(shape), data_start + begin, end - begin)


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_overlaps(path: Path, infos: Iterable[TensorInfo]) -> None:
    """Two tensors sharing bytes would make writing one change the other."""
    spans = sorted((i for i in infos if i.nbytes), key=lambda i: i.start)
    for before, after in itertools.pairwise(spans):
        if after.start < before.start + before.nbytes:
            raise ValueError(f"{path}: tensors {before.name!r} and {after.name!r} share bytes "
                             "(overlapping data_offsets); the file is corrupted")


def read_tensor(info: TensorInfo) -> Tensor:
    """The tensor's data, read from its file into a new CPU tensor of the file's dtype."""
    out = torch.empty(info.shape, dtype=info.dtype)  # what the header promised
    _read_into(info, out, info.start)
    return out


def read_rows(info: TensorInfo, start: int, stop: int) -> Tensor:
    """Rows start..stop-1 of the tensor (along its first dimension), read from its file
    alone: a slice of a table too big to hold twice."""
    if not info.shape or not 0 <= start <= stop <= info.shape[0]:
        raise ValueError(f"rows {start}..{stop} of tensor {info.name!r} {info.shape}: expected "
                         f"0 <= start <= stop <= {info.shape[0] if info.shape else 0}")
    out = torch.empty((stop - start, *info.shape[1:]), dtype=info.dtype)
    row_bytes = math.prod(info.shape[1:]) * info.dtype.itemsize
    _read_into(info, out, info.start + start * row_bytes)
    return out


def _read_into(info: TensorInfo, out: Tensor, offset: int) -> None:
    """Fill `out` (contiguous, CPU) with its nbytes from `info`'s file at byte `offset`."""
    nbytes = out.numel() * out.element_size()
    if nbytes == 0:
        return
    buffer = memoryview(out.reshape(-1).view(torch.uint8).numpy().data)  # nbytes, writable
    with open(info.path, "rb") as f:
        f.seek(offset)
        done = 0
        while done < nbytes:
            got = f.readinto(buffer[done:done + _READ_PIECE])
            if not got:
                raise ValueError(f"{info.path} ended inside tensor {info.name!r} (it was "
                                 "truncated after its header was read)")
            done += got


def same_rows(a: TensorInfo, b: TensorInfo) -> bool:
    """Whether two stored tensors hold equal values (`torch.equal`), read COMPARE_PIECE
    bytes of rows at a time from each file: never either tensor whole, so a large model's
    token table and head are compared in 2 * COMPARE_PIECE of memory."""
    if a.shape != b.shape:
        return False
    if not a.shape:
        return torch.equal(read_tensor(a), read_tensor(b))
    row_bytes = max(a.nbytes, b.nbytes) // max(a.shape[0], 1)
    rows = max(1, COMPARE_PIECE // max(row_bytes, 1))
    for start in range(0, a.shape[0], rows):
        stop = min(start + rows, a.shape[0])
        if not torch.equal(read_rows(a, start, stop), read_rows(b, start, stop)):
            return False  # a head that differs differs in its first rows: one slice read
    return True


def write_tensors(path: Path, tensors: Mapping[str, Tensor], metadata: Mapping[str, str],
                  progress: Callable[[int], None] | None = None) -> int:
    """Write `tensors` as the safetensors file `path` (the format above, as safetensors'
    `save_file` writes it) in the mapping's order; the bytes of tensor data written. Each
    tensor is made contiguous on the host only when its turn comes, so a transposed view
    costs a copy of itself alone, and views that share memory need no copies (save_file
    refuses them). progress: called with the data bytes written so far after each
    WRITE_PIECE bytes or less of a tensor (save_file writes a whole file in one call: a 1B
    model's 2 GB took seconds with nothing to show)."""
    header: dict[str, object] = {"__metadata__": dict(metadata)}
    offset = 0
    for name, tensor in tensors.items():
        if tensor.dtype not in _DTYPE_NAMES:
            raise ValueError(f"tensor {name!r} is {tensor.dtype}; safetensors holds "
                             f"{', '.join(map(str, _DTYPE_NAMES))}: convert it first")
        nbytes = tensor.numel() * tensor.element_size()
        header[name] = {"dtype": _DTYPE_NAMES[tensor.dtype], "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    # compact JSON padded with spaces to 8 bytes, so the data is aligned (as save_file does)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    written = 0
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for tensor in tensors.values():
            # the host's byte order is the format's (little-endian: every machine torch's
            # wheels are built for)
            data = tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
            buffer = memoryview(data.numpy().data)  # nbytes
            for start in range(0, len(buffer), WRITE_PIECE):
                piece = buffer[start:start + WRITE_PIECE]
                f.write(piece)
                written += len(piece)
                if progress is not None:
                    progress(written)
    return written


class WeightFiles(Protocol):
    """What loaders need from a model's weight files (`TensorFiles`; Hugging Face's
    pytorch_model.bin has its own): tensors read on request, and their metadata."""

    def __getitem__(self, name: str) -> Tensor: ...
    def __contains__(self, name: object) -> bool: ...
    def __iter__(self) -> Iterator[str]: ...
    def __len__(self) -> int: ...
    def meta(self) -> dict[str, Tensor]: ...
    def describe(self, name: str) -> str: ...
    def largest(self) -> int: ...
    def same(self, a: str, b: str) -> bool: ...
    def stored(self) -> dict[torch.dtype, int]: ...
    def paths(self) -> list[Path]: ...
    def forget(self) -> None: ...


def by_dtype(pairs: Iterable[tuple[torch.dtype, int]]) -> dict[torch.dtype, int]:
    totals: dict[torch.dtype, int] = {}
    for dtype, nbytes in pairs:
        totals[dtype] = totals.get(dtype, 0) + nbytes
    return totals


class TensorFiles(Mapping[str, Tensor]):
    """The tensors of one or more safetensors files as a read-on-request mapping:
    `files[name]` reads that tensor (the last one read is kept, so the three slices of a
    fused q/k/v weight read it once); `infos` has every tensor's dtype and shape, for
    checks that must not read data."""

    def __init__(self, paths: Iterable[Path]) -> None:
        self.infos: dict[str, TensorInfo] = {}
        for path in paths:
            for name, info in read_header(path).items():
                if name in self.infos:
                    raise ValueError(f"tensor {name!r} is in both {self.infos[name].path.name} "
                                     f"and {path.name}; a model's shards hold each tensor once")
                self.infos[name] = info
        self._last: tuple[str, Tensor] | None = None

    def __getitem__(self, name: str) -> Tensor:
        if self._last is None or self._last[0] != name:
            self._last = None  # drop the previous tensor before reading the next
            self._last = (name, read_tensor(self.infos[name]))
        return self._last[1]

    def __contains__(self, name: object) -> bool:  # Mapping's would read the tensor
        return name in self.infos

    def __iter__(self) -> Iterator[str]:
        return iter(self.infos)

    def __len__(self) -> int:
        return len(self.infos)

    def meta(self) -> dict[str, Tensor]:
        """Every tensor as a meta tensor of its dtype and shape: what a loader checks names
        and shapes on before it allocates (nothing is read or allocated)."""
        return {name: torch.empty(i.shape, dtype=i.dtype, device="meta")
                for name, i in self.infos.items()}

    def renamed(self, rename: Callable[[str], str]) -> TensorFiles:
        """The same files with each tensor's name passed through `rename` (a release that
        names its tensors otherwise than transformers writes them: `Family.renames`)."""
        out = TensorFiles([])
        out.infos = {rename(name): info for name, info in self.infos.items()}
        return out

    def describe(self, name: str) -> str:
        """"tensor 'x.weight' of model-00002.safetensors" for messages."""
        return f"tensor {name!r} of {self.infos[name].path.name}"

    def largest(self) -> int:
        """Bytes of the largest tensor: what reading one at a time holds besides the model."""
        return max((i.nbytes for i in self.infos.values()), default=0)

    def same(self, a: str, b: str) -> bool:
        """Whether tensors `a` and `b` hold equal values, compared a slice at a time
        (`same_rows`): what a loader asks of a tied config's stored head."""
        return same_rows(self.infos[a], self.infos[b])

    def stored(self) -> dict[torch.dtype, int]:
        """Bytes the files hold per dtype."""
        return by_dtype((i.dtype, i.nbytes) for i in self.infos.values())

    def paths(self) -> list[Path]:
        return sorted({i.path for i in self.infos.values()})

    def forget(self) -> None:
        """Drop the kept tensor (call when done)."""
        self._last = None
