"""Reading and writing Hugging Face model directories, for every family alike.

A directory (`save_pretrained`, or a hub snapshot copied by hand) holds
    config.json                      model_type and the architecture's fields
    model.safetensors                weights; or model.safetensors.index.json and its shards;
                                     or pytorch_model.bin (zip or legacy), read with
                                     weights_only=True
    tokenizer.json                   (or vocab.json + merges.txt for GPT-2)
    tokenizer_config.json            optional: bos/eos/pad tokens, add_bos_token
    generation_config.json           optional: bos/eos/pad token ids (these win)
Reading one needs only json, safetensors and torch: `transformers` is not imported here and
nothing is ever downloaded. What the weights and fields mean is the families' business
(registry.py and one module per family); reading the tokenizer files is
`attnlab.tokenizers.hf_dir`'s.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import shutil
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..checkpoint import unpickling_reason
from ..model.tensorfile import COMPARE_PIECE, TensorFiles, by_dtype, write_tensors
from ..tokenizers import HFTokenizer, TiktokenTokenizer, Tokenizer
from ..tokenizers.hf_dir import CONFIG_FILE, TOKENIZER_CONFIG, TOKENIZER_FILES, as_hf_backend

SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
#: the largest weight file an export writes before it starts another: huggingface_hub's
#: default ("5GB"; transformers 5's save_pretrained writes up to 50GB); an export holds one
#: shard's tensors beside the model while it writes (`write_weights`)
MAX_SHARD_SIZE = 5_000_000_000
#: the names of the shards `write_weights` writes (and transformers' save_pretrained)
SHARD_FILE = re.compile(r"model-\d{5}-of-\d{5}\.safetensors")
TORCH_FILE = "pytorch_model.bin"


def read_weights(directory: Path) -> TensorFiles | BinTensors:
    """The directory's weights by Hugging Face name, as a mapping that reads a tensor when it
    is asked for (`TensorFiles`; `BinTensors` for a pytorch_model.bin). Every safetensors
    header is checked first, and the index must name files next to it, each tensor once."""
    if (directory / SAFETENSORS_FILE).is_file():
        return TensorFiles([directory / SAFETENSORS_FILE])
    if (directory / SAFETENSORS_INDEX).is_file():
        return _sharded(directory)
    if (directory / TORCH_FILE).is_file():
        return BinTensors(directory / TORCH_FILE)
    raise FileNotFoundError(
        f"{directory} has no weights: expected {SAFETENSORS_FILE}, {SAFETENSORS_INDEX} or "
        f"{TORCH_FILE} next to its {CONFIG_FILE}"
    )


def chosen_weights(directory: Path) -> str:
    """"; read from model.safetensors, not model.safetensors.index.json beside it" where the
    directory holds more than one kind of weights (a stale file from an older download), ""
    otherwise: what an error about the weights adds, so that it names the file read.
    `read_weights` picks in transformers' order (modeling_utils: model.safetensors, then the
    index, then pytorch_model.bin)."""
    present = [name for name in (SAFETENSORS_FILE, SAFETENSORS_INDEX, TORCH_FILE)
               if (directory / name).is_file()]
    if len(present) < 2:
        return ""
    return (f"; read from {present[0]}, not {' or '.join(present[1:])} beside it (transformers "
            "reads the same one); remove the stale file")


def _sharded(directory: Path) -> TensorFiles:
    """The shard files model.safetensors.index.json names, checked: plain file names next to
    it, each tensor in the shard the index says."""
    path = directory / SAFETENSORS_INDEX
    try:
        index = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path} is not JSON ({err})") from None
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()):
        raise ValueError(f"{path} has no weight_map of tensor name -> shard file name")
    shards = sorted(set(weight_map.values()))
    for shard in shards:
        if Path(shard).name != shard or shard in ("", ".", ".."):
            # the index names files next to it, nothing else
            raise ValueError(f"{path} names shard {shard!r} outside the directory")
        if not (directory / shard).is_file():
            raise FileNotFoundError(f"{path} names shard {shard!r}, which is not in "
                                    f"{directory}; the download is incomplete")
    files = TensorFiles(directory / shard for shard in shards)
    for name, shard in weight_map.items():
        info = files.infos.get(name)
        if info is None or info.path.name != shard:
            found = "no shard" if info is None else info.path.name
            raise ValueError(f"{path} puts tensor {name!r} in {shard} but {found} holds it; "
                             "the index and the shards disagree")
    return files


class BinTensors(Mapping[str, Tensor]):
    """A pytorch_model.bin's tensors, read with weights_only=True (plain tensors only; a
    pickle that would run code is refused), with TensorFiles' `meta` and `describe`.

    A zip file (torch.save's format since PyTorch 1.6) is memory-mapped: a tensor is read
    from the file when it is copied. A legacy (non-zip) file cannot be mapped: opening it
    reads the names, shapes and dtypes alone, and the first tensor asked for reads the whole
    file, which a load then holds beside the model until it is done (`largest` says so, so
    the fit check counts it)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with open(path, "rb") as f:
            self.legacy = f.read(4) != b"PK\x03\x04"  # a zip's first local file header
        self._tensors = self._load(meta=self.legacy)
        self._shapes = {name: (t.shape, t.dtype) for name, t in self._tensors.items()}
        self._read = not self.legacy

    def _load(self, meta: bool) -> dict[str, Tensor]:
        """The state dict, memory-mapped (zip), or for a legacy file meta tensors (`meta`)
        or every tensor read into memory."""
        try:
            with _skipping_data() if meta else contextlib.nullcontext():
                state = torch.load(self.path, map_location="meta" if meta else "cpu",
                                   weights_only=True, mmap=not self.legacy)
        except Exception as err:
            # weights_only's refusal (code in the pickle) is pickle.UnpicklingError, named
            # here: the package never imports pickle (tests/test_security.py)
            if type(err).__name__ != "UnpicklingError":
                said = unpickling_reason(err).split(". ")[0]  # torch goes on for a paragraph
                raise ValueError(f"unable to read {self.path}: {said}; the file is truncated "
                                 "or not a torch.save file") from None
            raise ValueError(
                f"refusing {self.path} for safety: {unpickling_reason(err)}. A pickle can "
                "run code, so attnlab reads plain tensors only (weights_only=True); if you "
                "trust its source, convert it to model.safetensors (safetensors.torch."
                "save_file of its state dict) and load that") from None
        if not isinstance(state, dict) or not all(isinstance(t, Tensor) for t in state.values()):
            raise ValueError(f"{self.path} is not a state dict of tensors")
        return state

    def __getitem__(self, name: str) -> Tensor:
        if not self._read:
            self._tensors, self._read = self._load(meta=False), True
        return self._tensors[name]

    def __contains__(self, name: object) -> bool:
        return name in self._shapes

    def __iter__(self) -> Iterator[str]:
        return iter(self._shapes)

    def __len__(self) -> int:
        return len(self._shapes)

    def meta(self) -> dict[str, Tensor]:
        return {name: torch.empty(shape, dtype=dtype, device="meta")
                for name, (shape, dtype) in self._shapes.items()}

    def describe(self, name: str) -> str:
        return f"tensor {name!r} of {self.path.name}"

    def _sizes(self) -> list[int]:
        return [math.prod(shape) * dtype.itemsize for shape, dtype in self._shapes.values()]

    def largest(self) -> int:
        """Bytes a load holds besides the model: one tensor of a mapped file; all of a
        legacy one, read whole."""
        sizes = self._sizes()
        return sum(sizes) if self.legacy else max(sizes, default=0)

    def same(self, a: str, b: str) -> bool:
        """Whether tensors `a` and `b` hold equal values, compared COMPARE_PIECE bytes of
        rows at a time (a mapped file's pages are read as each slice is compared)."""
        x, y = self[a], self[b]
        if x.shape != y.shape:
            return False
        if x.dim() == 0:
            return torch.equal(x, y)
        rows = max(1, COMPARE_PIECE * x.shape[0] // max(x.nbytes, y.nbytes, 1))
        return all(torch.equal(x[start:start + rows], y[start:start + rows])
                   for start in range(0, x.shape[0], rows))

    def stored(self) -> dict[torch.dtype, int]:
        return by_dtype((dtype, math.prod(shape) * dtype.itemsize)
                        for shape, dtype in self._shapes.values())

    def paths(self) -> list[Path]:
        return [self.path]

    def forget(self) -> None:
        """Drop what was read: a legacy file's tensors (the next read loads them again)."""
        if self.legacy:
            self._tensors, self._read = {}, False


def _skipping_data() -> contextlib.AbstractContextManager[None]:
    """torch.load reading a file's pickle without its tensor data (torch 2.5 and later;
    before, a legacy file's data is read once, and dropped)."""
    skip = getattr(torch.serialization, "skip_data", None)
    return contextlib.nullcontext() if skip is None else skip()


def write_hf_dir(directory: Path, config: dict[str, Any],
                 weights: Iterable[tuple[str, Tensor]], sizes: Mapping[str, int],
                 tokenizer: Tokenizer | None, copy_from: Sequence[Path] = (), *,
                 max_shard_size: int = MAX_SHARD_SIZE,
                 progress: Callable[[int, int], None] | None = None) -> list[str]:
    """config.json + the weights (`write_weights`, with its `progress`), the tokenizer's
    tokenizer.json, and the tokenizer files (TOKENIZER_FILES) of the directories in
    `copy_from` that have them; the names of the weight files written."""
    directory.mkdir(parents=True, exist_ok=True)
    written = write_weights(directory, weights, sizes, max_shard_size, progress)
    (directory / CONFIG_FILE).write_text(json.dumps(config, indent=2))
    copied = set()  # the source's own files (a directory written over itself keeps them)
    for source in copy_from:
        for name in TOKENIZER_FILES:
            if (source / name).is_file():
                if source.resolve() != directory.resolve():
                    shutil.copyfile(source / name, directory / name)
                copied.add(name)
    # a tokenizer.json already there but not the source's is an earlier export's: replaced
    if tokenizer is None or "tokenizer.json" in copied:
        return written
    backend = tokenizer.backend if isinstance(tokenizer, HFTokenizer) else as_hf_backend(tokenizer)
    if backend is not None:
        backend.save(str(directory / "tokenizer.json"))
        if TOKENIZER_CONFIG not in copied:
            # names the class that reads tokenizer.json: without it transformers'
            # AutoTokenizer picks the model type's own (GPT2Tokenizer) and gets other ids
            (directory / TOKENIZER_CONFIG).write_text(json.dumps(
                {"tokenizer_class": "PreTrainedTokenizerFast",
                 "clean_up_tokenization_spaces": False}, indent=2))
    elif not (isinstance(tokenizer, TiktokenTokenizer) and tokenizer.vocab_size == 50257):
        warnings.warn(f"{directory}: the {tokenizer.name} tokenizer has no tokenizer.json "
                      "form, so the directory has no tokenizer (attnlab's commands "
                      "and transformers need one; save_checkpoint keeps any tokenizer)",
                      stacklevel=3)
    return written


def shards_of(sizes: Mapping[str, int], max_shard_size: int) -> list[list[str]]:
    """The tensor names of each shard, in order, for tensors of `sizes` bytes (in the order
    they are made): a shard takes tensors until the next would pass `max_shard_size`, and a
    tensor larger than that has a shard of its own. huggingface_hub's rule
    (`split_torch_state_dict_into_shards`), but that the hub keeps filling the shard it holds
    past such a tensor, where this closes it: each shard's tensors come one after another,
    so a shard is written whole before the next one's tensors are made."""
    if max_shard_size < 1:
        raise ValueError(f"max_shard_size={max_shard_size} bytes; give a positive size, e.g. "
                         f"{MAX_SHARD_SIZE} (5 GB, the default)")
    groups: list[list[str]] = []
    held = max_shard_size + 1  # no shard open yet
    for name, nbytes in sizes.items():
        if held + nbytes > max_shard_size:
            groups.append([])
            held = 0
        groups[-1].append(name)
        held += nbytes
    return groups


def shard_files(count: int) -> list[str]:
    """The weight files of `count` shards: model.safetensors alone, or transformers' names
    model-00001-of-00003.safetensors ..."""
    if count == 1:
        return [SAFETENSORS_FILE]
    return [f"model-{i:05d}-of-{count:05d}.safetensors" for i in range(1, count + 1)]


def write_weights(directory: Path, weights: Iterable[tuple[str, Tensor]],
                  sizes: Mapping[str, int], max_shard_size: int = MAX_SHARD_SIZE,
                  progress: Callable[[int, int], None] | None = None) -> list[str]:
    """Write `weights` (name, tensor), which come in the order and sizes of `sizes`, as
    safetensors shards of at most `max_shard_size` bytes each (a larger tensor alone), and
    model.safetensors.index.json after them; one model.safetensors when all fit in one.
    Only one shard's tensors are held at a time: `weights` may make each as it is asked for
    (`WeightMap.iter_to_hf`), so an export holds one shard beside the model, not a copy of
    it. Weight files an earlier export left (another shard count) are removed first, so a
    reader finds these alone. The names of the files written. progress: called as (bytes
    written, bytes to write) as each file is written, a piece at a time (`write_tensors`):
    one file of a large model takes seconds."""
    groups = shards_of(sizes, max_shard_size)
    files = shard_files(len(groups))
    _remove_weights(directory, keep=files)
    stream = iter(weights)
    total, done = sum(sizes.values()), 0
    for file, group in zip(files, groups, strict=True):
        shard: dict[str, Tensor] = {}
        for expected in group:
            name, tensor = next(stream)
            if name != expected:
                raise ValueError(f"weights came as {name!r} where the sizes listed "
                                 f"{expected!r}: they must list the same tensors in order")
            shard[name] = tensor
        # transformers refuses safetensors files without format metadata
        done += write_tensors(directory / file, shard, {"format": "pt"},
                              None if progress is None else _counting(progress, done, total))
    if len(files) == 1:
        return files
    index = {"metadata": {"total_size": total},
             "weight_map": {name: file for file, group in zip(files, groups, strict=True)
                            for name in group}}
    # written last: a reader that finds the index finds every shard it names
    (directory / SAFETENSORS_INDEX).write_text(json.dumps(index, indent=2))
    return [*files, SAFETENSORS_INDEX]


def _counting(progress: Callable[[int, int], None], before: int, total: int
              ) -> Callable[[int], None]:
    """One file's progress (its bytes written) as the export's: (bytes written, total)."""
    return lambda written: progress(before + written, total)


def _remove_weights(directory: Path, keep: Sequence[str]) -> None:
    """Remove the safetensors weights an earlier export left in `directory` that are not
    about to be rewritten (`keep`): a model.safetensors would shadow a new index (readers
    take it first), an index would name shards of another count."""
    stale = {SAFETENSORS_FILE, SAFETENSORS_INDEX}
    stale |= {p.name for p in directory.glob("model-*-of-*.safetensors")
              if SHARD_FILE.fullmatch(p.name)}
    for name in sorted(stale - set(keep)):
        (directory / name).unlink(missing_ok=True)


