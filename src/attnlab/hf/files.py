"""Reading and writing Hugging Face model directories, for every family alike.

A directory (`save_pretrained`, or a hub snapshot copied by hand) holds
    config.json                      model_type and the architecture's fields
    model.safetensors                weights; or model.safetensors.index.json and its shards;
                                     or pytorch_model.bin, read with weights_only=True
    tokenizer.json                   (or vocab.json + merges.txt for GPT-2)
    tokenizer_config.json            optional: bos/eos/pad tokens, add_bos_token
    generation_config.json           optional: bos/eos/pad token ids (these win)
Reading one needs only json, safetensors and torch: `transformers` is not imported here and
nothing is ever downloaded. What the weights and fields mean is the families' business
(registry.py and one module per family); reading the tokenizer files is
`attnlab.tokenizers.hf_dir`'s.
"""

from __future__ import annotations

import json
import shutil
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..tokenizers import HFTokenizer, TiktokenTokenizer, Tokenizer
from ..tokenizers.hf_dir import CONFIG_FILE, TOKENIZER_CONFIG, TOKENIZER_FILES, as_hf_backend

SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
TORCH_FILE = "pytorch_model.bin"


def read_weights(directory: Path) -> dict[str, Tensor]:
    """Every tensor of the directory's weight file(s), by Hugging Face name, on the CPU."""
    from safetensors.torch import load_file

    if (directory / SAFETENSORS_FILE).is_file():
        return load_file(str(directory / SAFETENSORS_FILE))
    if (directory / SAFETENSORS_INDEX).is_file():
        index = json.loads((directory / SAFETENSORS_INDEX).read_text())
        weights: dict[str, Tensor] = {}
        for shard in sorted(set(index["weight_map"].values())):
            if Path(shard).name != shard:  # the index names files next to it, nothing else
                raise ValueError(f"{directory / SAFETENSORS_INDEX} names shard {shard!r} "
                                 "outside the directory")
            weights.update(load_file(str(directory / shard)))
        return weights
    if (directory / TORCH_FILE).is_file():
        try:
            state: dict[str, Tensor] = torch.load(
                directory / TORCH_FILE, map_location="cpu", weights_only=True
            )
        except Exception as err:  # UnpicklingError for unsafe content, RuntimeError if truncated
            raise ValueError(
                f"refusing or unable to load {directory / TORCH_FILE}: {err}. attnlab reads "
                "plain tensors only (weights_only=True); convert it to model.safetensors"
            ) from err
        return state
    raise FileNotFoundError(
        f"{directory} has no weights: expected {SAFETENSORS_FILE}, {SAFETENSORS_INDEX} or "
        f"{TORCH_FILE} next to its {CONFIG_FILE}"
    )


def write_hf_dir(directory: Path, config: dict[str, Any], weights: dict[str, Tensor],
                 tokenizer: Tokenizer | None, copy_from: Sequence[Path] = ()) -> None:
    """config.json + model.safetensors, the tokenizer's tokenizer.json, and the tokenizer
    files (TOKENIZER_FILES) of the directories in `copy_from` that have them."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    # transformers refuses safetensors files without format metadata
    save_file(weights, str(directory / SAFETENSORS_FILE), {"format": "pt"})
    (directory / CONFIG_FILE).write_text(json.dumps(config, indent=2))
    for source in copy_from:
        for name in TOKENIZER_FILES:
            if (source / name).is_file() and source.resolve() != directory.resolve():
                shutil.copyfile(source / name, directory / name)
    if tokenizer is None or (directory / "tokenizer.json").is_file():
        return
    backend = tokenizer.backend if isinstance(tokenizer, HFTokenizer) else as_hf_backend(tokenizer)
    if backend is not None:
        backend.save(str(directory / "tokenizer.json"))
        if not (directory / TOKENIZER_CONFIG).is_file():
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


