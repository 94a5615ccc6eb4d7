"""`DerivedFiles`: a directory's weight files with some stored tensors shown as the float
tensors they encode (gpt-oss's MXFP4 blocks and scales, `mxfp4.py`; block-quantized FP8
weights and their scales, `fp8.py`), each decoded when it is read."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

import torch
from torch import Tensor

from ..model.tensorfile import WeightFiles


class DerivedFiles(Mapping[str, Tensor]):
    """`files` (`WeightFiles`) with each name of `derived` ({name: the stored names it comes
    from}) shown as one tensor of `shapes[name]` in `dtype`, and the stored names it comes
    from hidden; `decode(name)` reads one. Every other tensor and method is the files' own;
    `largest` counts a decoded tensor beside the stored bytes it comes from."""

    #: what `describe` says of a decoded tensor: "(MXFP4, dequantized)"
    kind = ""

    def __init__(self, files: WeightFiles, derived: Mapping[str, tuple[str, ...]],
                 shapes: Mapping[str, tuple[int, ...]], dtype: torch.dtype) -> None:
        self.files, self.derived = files, dict(derived)
        hidden = {stored for names in self.derived.values() for stored in names}
        self._names = [name for name in files if name not in hidden or name in self.derived
                       ] + [name for name in self.derived if name not in files]
        meta = files.meta()
        self._meta = {name: meta[name] for name in self._names if name not in self.derived}
        for name in self.derived:
            self._meta[name] = torch.empty(shapes[name], dtype=dtype, device="meta")
        self._stored_bytes = {name: sum(meta[s].nbytes for s in stored)
                              for name, stored in self.derived.items()}

    def decode(self, name: str) -> Tensor:
        raise NotImplementedError

    def __getitem__(self, name: str) -> Tensor:
        return self.decode(name) if name in self.derived else self.files[name]

    def __contains__(self, name: object) -> bool:
        return name in self._meta

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def meta(self) -> dict[str, Tensor]:
        return dict(self._meta)

    def describe(self, name: str) -> str:
        if name in self.derived:
            return f"{self.files.describe(self.derived[name][0])} ({self.kind}, dequantized)"
        return self.files.describe(name)

    def largest(self) -> int:
        decoded = max((self._meta[name].nbytes + self._stored_bytes[name]
                       for name in self.derived), default=0)
        return max(self.files.largest(), decoded)

    def same(self, a: str, b: str) -> bool:
        return self.files.same(a, b)

    def stored(self) -> dict[torch.dtype, int]:
        return self.files.stored()

    def paths(self) -> list[Path]:
        return self.files.paths()

    def forget(self) -> None:
        self.files.forget()
