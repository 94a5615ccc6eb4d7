"""Open any model directory: an attnlab checkpoint (or a run directory) or a Hugging Face
model directory of a supported family. The one place that knows both kinds exist:
`checkpoint.py` reads attnlab's, `hf` reads Hugging Face's, and every command opens a
directory through `load_checkpoint`, or describes one without loading it through
`inspect_dir`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .checkpoint import (
    STATE_FILE,
    Checkpoint,
    OpenedCheckpoint,
    load_attnlab_checkpoint,
    open_attnlab_checkpoint,
    open_attnlab_dir,
)
from .hf import family_of, load_hf_checkpoint, open_hf_checkpoint, open_hf_weights
from .model.config import GPTConfig
from .model.materialize import OpenedWeights, Progress
from .model.memory import Use, fit_report
from .model.packed import packed_layers, packed_size
from .tokenizers import NoTokenizerError, Tokenizer, check_fits, load_hf_tokenizer, load_tokenizer
from .tokenizers.hf_dir import GENERATION_CONFIG, is_hf_dir, read_hf_config, read_json

#: generation_config.json fields `inspect_dir` reports (the sampling defaults a model ships)
GENERATION_FIELDS = ("bos_token_id", "eos_token_id", "pad_token_id", "do_sample",
                     "temperature", "top_k", "top_p", "repetition_penalty", "max_new_tokens",
                     "max_length")


def load_checkpoint(
    directory: str | Path, *, map_location: str | torch.device = "cpu",
    dtype: torch.dtype | str | None = None, force: bool = False,
    progress: Progress | None = None,
) -> Checkpoint:
    """Load model (eval mode), tokenizer and meta from a checkpoint directory, or from a
    Hugging Face model directory of a supported family (`attnlab.hf`), on `map_location`,
    in `dtype` (default: float32; torch.bfloat16 or "bfloat16").

    Both kinds are checked before anything is allocated (names, shapes and dtypes from the
    file headers against the config; then the memory `map_location` has free, which
    `force=True` skips) and read one tensor at a time into the model's own memory;
    `progress(tensors read, tensors in all)` hears after each."""
    if is_hf_dir(directory):
        return load_hf_checkpoint(directory, map_location=map_location, dtype=dtype,
                                  force=force, progress=progress)
    return load_attnlab_checkpoint(directory, map_location=map_location, dtype=dtype,
                                   force=force, progress=progress)


def open_checkpoint(directory: str | Path) -> OpenedCheckpoint:
    """A model directory of either kind opened and checked as `load_checkpoint` checks it
    (config, weight headers, tokenizer), nothing allocated: `.config`, `.tokenizer` and
    `.weights.model` (meta device) size what a caller will run, and `.load(...,
    uses=[memory.Use(...)])` loads it once the model and those uses fit."""
    if is_hf_dir(directory):
        return open_hf_checkpoint(directory)
    return open_attnlab_checkpoint(directory)


@dataclass
class ModelInfo:
    """What a model directory holds, read from its metadata alone (`inspect_dir`)."""

    path: Path
    source: str  # "attnlab" or "huggingface"
    config: GPTConfig
    parameters: int  # as the model would hold them (a tied table counted once)
    stored: dict[str, int]  # bytes the weight files hold per dtype ("bfloat16": 141e9)
    tensors: int
    weight_files: list[str]
    largest_tensor: int  # bytes: what a load holds besides the model
    tokenizer: Tokenizer | None
    family: str | None = None  # Hugging Face directories: "llama"
    architecture: str | None = None
    generation: dict[str, Any] = field(default_factory=dict)  # generation_config.json
    meta: dict[str, Any] = field(default_factory=dict)  # attnlab: step, losses, train config
    resumable: bool = False
    notes: list[str] = field(default_factory=list)  # e.g. "no tokenizer files"
    #: where the weights can load packed (gpt-oss's MXFP4 experts, FP8 matrices): (weights
    #: packed, their bytes, the largest tensor read on the way, what they are: "MXFP4
    #: experts"); None elsewhere
    packed: tuple[int, int, int, str] | None = None

    def memory(self, device: str | torch.device = "cpu") -> dict[str, dict[str, Any]]:
        """What loading would need at each dtype on `device`, and whether it fits now; where
        the weights can load packed, that too ("bfloat16 + MXFP4 experts")."""
        report = fit_report(self.parameters, device, extra=self.largest_tensor)
        if self.packed is not None:
            weights, nbytes, largest, what = self.packed
            packed = fit_report(self.parameters - weights, device, extra=largest,
                                uses=[Use(f"the packed {what}", nbytes=nbytes)])
            report.update({f"{name} + {what}": r for name, r in packed.items()})
        return report


def inspect_dir(directory: str | Path) -> ModelInfo:
    """Describe a model directory from config.json, the weight files' headers and the
    tokenizer files, never the tensors whole: instant and flat in memory for a model of any
    size. The headers are checked against the config as a load would check them (ValueError
    naming the first tensor that does not fit). A tied Hugging Face config whose files store
    a head too has the head compared with the token table, a slice at a time, so that the
    parameters and memory reported are what the load holds (a note says what was found)."""
    notes: list[str] = []
    if is_hf_dir(directory):
        path = Path(directory)
        hf_config = read_hf_config(path)
        family = family_of(hf_config)
        opened = open_hf_weights(path)
        if opened.decide is not None:  # count what the load will hold: compare, in slices
            opened = opened.decided()
            notes.append(_stored_head_note(opened.config.tie_weights))
        try:
            tokenizer: Tokenizer | None = load_hf_tokenizer(path, opened.config.vocab_size)
            check_fits(tokenizer, opened.config.vocab_size)
        except NoTokenizerError as err:  # a weights-only directory: say so, go on
            tokenizer = None
            notes.append(str(err))
        return _info(path, "huggingface", opened, tokenizer, notes, family=family.name,
                     architecture=family.architecture, generation=_generation(path))
    path, meta, opened = open_attnlab_dir(directory)
    tokenizer = load_tokenizer(path)
    check_fits(tokenizer, opened.config.vocab_size)
    return _info(path, "attnlab", opened, tokenizer, notes, meta=meta,
                 resumable=(path / STATE_FILE).exists())


def _stored_head_note(tied: bool) -> str:
    """What `inspect_dir` found in a tied config's files that store a head too."""
    if tied:
        return ("config.json ties the output head to the token table and the weights store "
                "lm_head.weight too, equal to the table: one tensor, tied")
    return ("config.json ties the output head to the token table but the weights store an "
            "lm_head.weight that differs from it: loaded as a separate head, as transformers "
            "does, and counted in the parameters")


def _info(path: Path, source: str, opened: OpenedWeights, tokenizer: Tokenizer | None,
          notes: list[str], **more: Any) -> ModelInfo:
    files = opened.files
    note = getattr(files, "note", None)  # what quantized weights say of themselves
    if note:
        notes.append(note)
    if opened.packed is not None:
        packed = opened.packed()
        more["packed"] = (*packed_size(packed.model), packed.files.largest(),
                          packed_layers(packed.model)[0].label)
    return ModelInfo(
        path=path, source=source, config=opened.config,
        parameters=opened.model.num_params(non_embedding=False),
        stored={_name(dtype): n for dtype, n in files.stored().items()}, tensors=len(files),
        weight_files=[p.name for p in files.paths()], largest_tensor=files.largest(),
        tokenizer=tokenizer, notes=notes, **more)


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _generation(directory: Path) -> dict[str, Any]:
    """The sampling settings a Hugging Face directory ships (generation_config.json)."""
    settings = read_json(directory / GENERATION_CONFIG)
    return {k: settings[k] for k in GENERATION_FIELDS if k in settings}
