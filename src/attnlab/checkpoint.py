"""Checkpoints: a directory that is either complete or absent, and loads without pickle.

Layout of a checkpoint directory:
    model.safetensors   weights (safetensors: no code can run on load)
    config.json         {"model": GPTConfig fields, "meta": step, losses, train config, ...}
    tokenizer_config.json (+ tokenizer.json for BPE)   the tokenizer, see attnlab.tokenizers
    train_state.pt      optimizer / scheduler / step / RNG, read with weights_only=True

`save_checkpoint` writes everything into a temporary sibling directory and renames it into
place, so a crash (even SIGKILL) mid-write leaves the previous checkpoint intact; the next
save clears what a killed writer left behind. One process writes a given directory at a
time. This module does not know how training works; `train/loop.py` decides what goes in
train_state.
"""

from __future__ import annotations

import copy
import json
import math
import os
import re
import shutil
import threading
import time
import types
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union, get_args, get_origin, get_type_hints

import torch

from .model.gpt import GPT, GPTConfig
from .model.materialize import (
    OpenedWeights,
    Progress,
    check_layer_count,
    check_shapes,
    meta_gpt,
    mismatch,
)
from .model.memory import Use
from .model.packed import refuse_packed
from .model.runtime import resolve_device
from .model.tensorfile import TensorFiles
from .tokenizers import Tokenizer, check_fits, load_tokenizer

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
STATE_FILE = "train_state.pt"
# tied weights are one tensor, stored once under the head's name (as safetensors' save_model
# names it); a file holding the other name loads too
TIED = ("lm_head.weight", "wte.weight")


@dataclass
class Checkpoint:
    model: GPT  # in eval mode
    tokenizer: Tokenizer
    meta: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None

    def __repr__(self) -> str:  # a notebook's line, not the module tree and the whole meta
        c = self.model.config
        step = f", step={self.meta['step']}" if "step" in self.meta else ""
        where = "" if self.path is None else f"{str(self.path)!r}: "
        return (f"Checkpoint({where}{c.n_layer} layers, {c.n_head} heads, "
                f"{c.n_embd} dims, vocab {c.vocab_size}, tokenizer={self.tokenizer!r}{step})")


def save_checkpoint(
    directory: str | Path,
    model: GPT,
    tokenizer: Tokenizer,
    *,
    train_state: dict[str, Any] | None = None,
    meta: dict[str, Any] | None = None,
) -> Path:
    """Write a complete checkpoint to `directory`, replacing any previous one atomically."""
    _check_saved(directory, model, tokenizer)
    return _write(Path(directory), _weights(model), model.config, tokenizer, train_state, meta)


def _check_saved(directory: object, model: object, tokenizer: object) -> None:
    """Refuse, before anything is written, what `load_checkpoint` could not load back."""
    if not isinstance(directory, str | os.PathLike):
        raise TypeError(f"save_checkpoint(directory, model, tokenizer): directory is a "
                        f"{type(directory).__name__}; pass a path first")
    if not isinstance(model, GPT):
        raise TypeError(f"save_checkpoint(directory, model, tokenizer): model is a "
                        f"{type(model).__name__}, not an attnlab GPT")
    if not isinstance(tokenizer, Tokenizer):
        raise TypeError(f"save_checkpoint(directory, model, tokenizer): tokenizer is a "
                        f"{type(tokenizer).__name__}; a checkpoint needs the model's tokenizer "
                        "(attnlab.get_tokenizer, load_tokenizer)")
    check_fits(tokenizer, model.config.vocab_size)
    refuse_packed(model, "save_checkpoint")


class CheckpointWriter:
    """Checkpoints written on a thread of their own, one at a time, so that training goes on
    while one is written (most of a save is the disk's: fsync, unlinking the old one). `save`
    copies what it writes into host memory first, so the caller may change the model and the
    optimizer as soon as it returns, and waits for the previous write; `wait` returns when
    the last write is complete, raising what it raised. A killed process leaves the previous
    checkpoint intact, as `save_checkpoint` does."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def save(self, directory: str | Path, model: GPT, tokenizer: Tokenizer, *,
             train_state: dict[str, Any] | None = None,
             meta: dict[str, Any] | None = None) -> Path:
        """Start writing the checkpoint `save_checkpoint` would write; returns its path."""
        _check_saved(directory, model, tokenizer)
        self.wait()
        directory = Path(directory)
        args = (directory, _weights(model, to_host=True), model.config, tokenizer,
                _host_copy(train_state), copy.deepcopy(meta))
        self._thread = threading.Thread(target=self._run, args=args, name="attnlab-checkpoint")
        self._thread.start()
        return directory

    def _run(self, *args: Any) -> None:
        try:
            _write(*args)
        except BaseException as err:  # raised in the caller's thread by wait()
            self._error = err

    def wait(self) -> None:
        """Block until the last checkpoint is written; raise what its write raised."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        error, self._error = self._error, None
        if error is not None:
            raise error


def _host_copy(value: Any) -> Any:
    """value with every tensor in it copied into host memory (dicts, lists, tuples walked)."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {key: _host_copy(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_host_copy(item) for item in value)
    return value


def _write(directory: Path, weights: tuple[dict[str, torch.Tensor], dict[str, str]],
           config: GPTConfig, tokenizer: Tokenizer, train_state: dict[str, Any] | None,
           meta: dict[str, Any] | None) -> Path:
    """The checkpoint into a temporary sibling of `directory`, then renamed into place."""
    from safetensors.torch import save_file

    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = directory.with_name(f".{directory.name}.tmp-{os.getpid()}")
    old = directory.with_name(f".{directory.name}.old-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        save_file(weights[0], str(tmp / WEIGHTS_FILE), weights[1])
        blob = {"model": config.to_dict(), "meta": meta or {}}
        (tmp / CONFIG_FILE).write_text(json.dumps(blob, indent=2))
        tokenizer.save(tmp)
        if train_state is not None:
            torch.save(train_state, tmp / STATE_FILE)
        _fsync_dir(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    # Two renames: the old checkpoint stays complete until the new one is in place, and
    # `load_attnlab_checkpoint` falls back to `.old` if a crash lands between them.
    if directory.exists():
        os.replace(directory, old)
    os.replace(tmp, directory)
    # ours, and any a writer killed mid-save left (half-written tmp, or old not yet removed)
    for stale in _siblings(directory, "tmp") + _siblings(directory, "old"):
        shutil.rmtree(stale, ignore_errors=True)
    return directory


def _siblings(directory: Path, kind: str) -> list[Path]:
    """`.NAME.tmp-PID` or `.NAME.old-PID` directories next to `directory`."""
    parent = directory.parent
    return list(parent.glob(f".{directory.name}.{kind}-*")) if parent.is_dir() else []


def _fsync_dir(directory: Path) -> None:
    for path in directory.iterdir():
        with open(path, "rb") as f:
            os.fsync(f.fileno())


def find_checkpoint(directory: str | Path) -> Path | None:
    """The directory holding the newest complete checkpoint saved as `directory`, or None.

    That is `directory` itself, or its `.old-PID` sibling when a writer was killed between
    moving the previous checkpoint aside and renaming the new one into place.
    """
    directory = Path(directory)
    if directory.is_dir():
        return directory
    olds = [p for p in _siblings(directory, "old") if (p / CONFIG_FILE).exists()]
    return max(olds, key=lambda p: (p / CONFIG_FILE).stat().st_mtime, default=None)


def _resolve(directory: Path) -> Path:
    """The checkpoint saved as `directory`, or in `directory/ckpt` (a run directory, as
    `attnlab train --out` makes: `attnlab info runs/copy` finds runs/copy/ckpt)."""
    found = find_checkpoint(directory)
    if found is not None and not (found / CONFIG_FILE).exists():
        inner = find_checkpoint(found / "ckpt")
        if inner is not None and (inner / CONFIG_FILE).exists():
            return inner
    if found is not None:
        return found
    if directory.is_file():
        holder = directory.parent
        raise NotADirectoryError(
            f"{directory} is a file; a checkpoint is the directory that holds it: pass "
            + (str(holder) if (holder / CONFIG_FILE).exists() else "a directory holding "
               f"{CONFIG_FILE} and {WEIGHTS_FILE} (attnlab train --out writes one)")
        )
    raise FileNotFoundError(
        f"checkpoint directory {directory} does not exist; train one with "
        f"`attnlab train --out {directory.parent if directory.name == 'ckpt' else directory}`, "
        "or pass a Hugging Face model directory (save_pretrained: config.json and weights)"
    )


def read_config(directory: str | Path) -> tuple[GPTConfig, dict[str, Any]]:
    """(GPTConfig, meta) of a checkpoint, without loading weights."""
    directory = _resolve(Path(directory))
    path = directory / CONFIG_FILE
    if not path.exists():
        raise FileNotFoundError(
            f"{directory} has no {CONFIG_FILE}, so it holds no model: pass an attnlab checkpoint "
            "(`attnlab train --out DIR` writes one to DIR/ckpt) or a Hugging Face model "
            f"directory ({CONFIG_FILE} and weights, as `attnlab export` or save_pretrained "
            "write)")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as err:  # JSONDecodeError and UnicodeDecodeError
        raise ValueError(f"{path} is not JSON ({err}): the file is truncated or "
                         "corrupted") from err
    if not isinstance(config, dict) or "model" not in config:
        raise ValueError(f"{path} has no \"model\" section, so it is neither an attnlab "
                         "checkpoint's config nor a Hugging Face one (those name a "
                         "model_type): corrupted?")
    try:
        model, meta = config["model"], config.get("meta", {})
        if isinstance(model, dict):  # configs saved before a field changed its type
            model = GPTConfig.upgrade(model)
        _check_json_types(model, GPTConfig)
        if not isinstance(meta, dict):
            raise TypeError(f"meta is {type(meta).__name__}, not an object")
        return GPTConfig.from_dict(model), meta
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(
            f"{path} is not a valid attnlab config ({type(err).__name__}: {err}): corrupted?"
        ) from err


def _check_json_types(values: Any, cls: type) -> None:
    """Raise TypeError unless `values` is a dict whose known fields have `cls`'s types.

    JSON has no types beyond these, so a field that parses but holds, say, a string where
    a float belongs is damage; without this check it fails later, deep inside torch.
    """
    if not isinstance(values, dict):
        raise TypeError(f"the model config is {type(values).__name__}, not an object")
    hints = get_type_hints(cls)
    for name, value in values.items():
        hint = hints.get(name)
        if hint is not None and not _json_value_fits(value, hint):
            shown = hint.__name__ if isinstance(hint, type) else str(hint)
            raise TypeError(f"{cls.__name__}.{name}={value!r} is not of type {shown}")


def _json_value_fits(value: Any, annotation: Any) -> bool:
    """Whether a parsed JSON value has one of the types in `annotation` (bool is no int):
    scalars, None, Any, list[X] and dict[str, X] of them."""
    if get_origin(annotation) in (Union, types.UnionType):
        return any(_json_value_fits(value, tp) for tp in get_args(annotation))
    if annotation is Any:
        return True
    if get_origin(annotation) is list:
        (item,) = get_args(annotation)
        return isinstance(value, list) and all(_json_value_fits(v, item) for v in value)
    if get_origin(annotation) is dict:
        key, item = get_args(annotation)
        return isinstance(value, dict) and all(
            _json_value_fits(k, key) and _json_value_fits(v, item) for k, v in value.items())
    kinds = {
        type(None): value is None,
        bool: isinstance(value, bool),
        int: isinstance(value, int) and not isinstance(value, bool),
        float: isinstance(value, (int, float)) and not isinstance(value, bool)
        and math.isfinite(value),
        str: isinstance(value, str),
    }
    return kinds.get(annotation, False)


def load_attnlab_checkpoint(
    directory: str | Path, *, map_location: str | torch.device = "cpu",
    dtype: torch.dtype | str | None = None, force: bool = False,
    progress: Progress | None = None,
) -> Checkpoint:
    """Load model (eval mode), tokenizer and meta from an attnlab checkpoint directory (or a
    run directory: its latest checkpoint). `attnlab.load_checkpoint` also opens Hugging Face
    directories."""
    path = Path(directory)
    for _ in range(_READ_TRIES - 1):
        before = _identity(path)
        try:
            return _load(path, map_location, dtype, force, progress)
        except (OSError, ValueError):
            # a training run replaced the checkpoint as we read it (a new directory now, or
            # its .tmp / .old directories beside it meanwhile): read the new one
            saving = [d for place in (path, path / "ckpt")
                      for kind in ("tmp", "old") for d in _siblings(place, kind)]
            if not saving and _identity(path) == before:
                raise
        time.sleep(0.2)
    return _load(path, map_location, dtype, force, progress)


def _identity(directory: Path) -> tuple[int, int] | None:
    """(inode, mtime) of the checkpoint directory `directory` stands for; a save puts a new
    directory in place. None while there is none."""
    try:
        stat = os.stat(_resolve(directory))
    except OSError:
        return None
    return stat.st_ino, stat.st_mtime_ns


_READ_TRIES = 5


def open_attnlab_weights(directory: Path, config: GPTConfig) -> OpenedWeights:
    """The checkpoint's model.safetensors checked against `config` by its header alone;
    ValueError naming the first tensor that does not fit."""
    weights = directory / WEIGHTS_FILE
    if not weights.exists():
        raise FileNotFoundError(f"{directory} has no {WEIGHTS_FILE}; the checkpoint is incomplete")
    try:
        files = TensorFiles([weights])
        check_layer_count(config.n_layer, files, "blocks.{i}.", what=CONFIG_FILE)
        names = _file_names(files, config)
        model = meta_gpt(config)
        metas = files.meta()
        summary = mismatch(model, {ours: metas[name] for ours, name in names.items()})
        if summary:
            raise ValueError(summary)
        if config.tie_weights:  # one tensor, filled under the table's name
            names.pop(TIED[0], None)
        check_shapes(model, ((ours, metas[name]) for ours, name in names.items()))
    except ValueError as err:
        raise ValueError(f"weights in {weights} do not fit the model described by "
                         f"{CONFIG_FILE}: {err}. The file is corrupted or belongs to another "
                         "config") from None
    return OpenedWeights(config, model, files,
                         lambda: ((ours, files[name]) for ours, name in names.items()))


def open_attnlab_dir(directory: str | Path) -> tuple[Path, dict[str, Any], OpenedWeights]:
    """(the checkpoint directory a path stands for, its meta, its weights opened and checked
    against its config): everything but the tensors' data."""
    directory = _resolve(Path(directory))
    config, meta = read_config(directory)
    return directory, meta, open_attnlab_weights(directory, config)


def open_attnlab_checkpoint(directory: str | Path) -> OpenedCheckpoint:
    """An attnlab checkpoint (or run) directory opened: config, meta, tokenizer (read and
    checked against the config) and the weights' header, nothing allocated."""
    directory, meta, opened = open_attnlab_dir(directory)
    tokenizer = load_tokenizer(directory)
    check_fits(tokenizer, opened.config.vocab_size)
    return OpenedCheckpoint(directory, opened, tokenizer, meta)


def _load(directory: Path, map_location: str | torch.device,
          dtype: torch.dtype | str | None = None,
          force: bool = False, progress: Progress | None = None) -> Checkpoint:
    opened = open_attnlab_checkpoint(directory)
    return opened.load(map_location=map_location, dtype=dtype, force=force, progress=progress)


@dataclass
class OpenedCheckpoint:
    """A model directory opened and checked, the tensors not read: its config, meta-device
    model, tokenizer and meta (`attnlab.load.open_checkpoint`). A caller sizes its work by
    them (prompt lengths, a KV cache) and then `load`s it with that work counted in the fit
    check. `weights.model` counts a tied config's stored head as its own until the load
    compares it with the token table (`OpenedWeights.decide`)."""

    path: Path
    weights: OpenedWeights
    tokenizer: Tokenizer
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def config(self) -> GPTConfig:
        return self.weights.config

    def load(self, *, map_location: str | torch.device = "cpu",
             dtype: torch.dtype | str | None = None, force: bool = False,
             progress: Progress | None = None, uses: Sequence[Use] = ()) -> Checkpoint:
        """The checkpoint, as `load_checkpoint` returns it, once the model and `uses` (what
        the caller allocates beside it) fit in the memory `map_location` has free."""
        device = resolve_device(str(map_location))  # a missing CUDA is not a corrupted file
        try:
            model = self.weights.fill(dtype, device, force, progress, uses)
        except ValueError as err:  # e.g. a file ended early: was it replaced meanwhile?
            gone = [p for p in self.weights.files.paths() if not p.exists()]
            if not gone:
                raise
            raise FileNotFoundError(f"{gone[0]} was removed while it was read (a training run "
                                    "replacing the checkpoint?); load it again") from err
        return Checkpoint(model, self.tokenizer, self.meta, self.path)


def _file_names(files: TensorFiles, config: GPTConfig) -> dict[str, str]:
    """{model parameter: the file's name for it}: the names are the model's own, but tied
    weights are stored once, under either name (TIED)."""
    names = {name: name for name in files}
    if config.tie_weights:
        for name, other in (TIED, TIED[::-1]):
            if name not in files and other in files:
                names[name] = other
    return names


def _weights(model: GPT, to_host: bool = False
             ) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The tensors and metadata of model.safetensors, row-major (safetensors' own save_model
    cannot read the (in, out) memory of GPT's Linear weights: see GPT.lay_out_weights);
    to_host: copies in host memory, whatever the model does next."""
    state = {name: torch.empty(t.shape, dtype=t.dtype).copy_(t) if to_host else t.contiguous()
             for name, t in model.state_dict().items()}  # a host copy: one, row-major
    metadata = {"format": "pt"}
    if model.config.tie_weights:
        kept, dropped = TIED
        del state[dropped]
        metadata[dropped] = kept
    return state, metadata


def load_train_state(directory: str | Path, *, mmap: bool = False) -> dict[str, Any]:
    """The optimizer/step/RNG state saved with a checkpoint, loaded without unpickling code;
    mmap=True maps the tensors instead of reading them (a check of the file, cheap)."""
    path = _resolve(Path(directory)) / STATE_FILE
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: the checkpoint has no training state")
    try:
        state: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True,
                                           mmap=mmap)
    except Exception as err:  # UnpicklingError for unsafe content, RuntimeError for truncation
        raise ValueError(
            f"refusing or unable to load {path}: {unpickling_reason(err)}. attnlab only loads "
            "plain tensors and containers (weights_only=True); the file is corrupted or not "
            "from attnlab"
        ) from err
    return state


def train_state_problem(directory: str | Path) -> str | None:
    """Why the training state saved with a checkpoint cannot be resumed from (missing, cut
    short, or with code in it), or None; mmap: the zip's directory and records are checked,
    the tensors not read. `attnlab train --resume` refuses on it, `attnlab info` says it."""
    try:
        load_train_state(directory, mmap=True)
    except (OSError, ValueError) as err:
        return str(err)
    return None


def unpickling_reason(err: Exception) -> str:
    """The line of torch's message that says what was refused ("Trying to load unsupported
    GLOBAL posix.system ..."), without the paragraphs around it that suggest weights_only=False
    or allowlisting the global, i.e. running the code after all."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(err))  # no terminal colour codes
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    boilerplate = ("Weights only load failed", "Check the documentation", "(1)", "(2)")
    useful = [line for line in lines
              if not line.startswith(boilerplate) and "`weights_only`" not in line]
    reason = (useful or lines or [type(err).__name__])[0]
    return reason.removeprefix("WeightsUnpickler error: ").split(". Please use")[0].rstrip(".")
