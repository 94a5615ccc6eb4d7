"""`attnlab export CHECKPOINT OUT [--family NAME] [--dtype bfloat16]`: write a checkpoint as a
Hugging Face model directory (config.json, model.safetensors, tokenizer.json) that
transformers' `AutoModelForCausalLM.from_pretrained(OUT)` and every attnlab command load.
The weights are written in the dtype they were loaded in (--dtype), in shards of at most
--max_shard_size (model-00001-of-0000N.safetensors and model.safetensors.index.json) where
they do not fit in one: the export holds one shard beside the model while it writes.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .common import (
    DTYPES,
    CLIError,
    add_checkpoint_argument,
    add_force_flag,
    count,
    load_opened,
    open_model,
)
from .outputs import written_together
from .progress import Counter

if TYPE_CHECKING:
    from ..model.memory import Use

# the names of hf.FAMILIES an export may write, listed here so `attnlab --help` imports
# nothing heavy (a test holds them equal)
FAMILY_NAMES = ("gpt2", "llama", "mistral", "ministral", "qwen2", "qwen3", "gpt_neox", "gemma",
                "gemma2", "gemma3", "phi", "phi3", "olmo", "olmo2", "olmo3", "smollm3", "gptj",
                "gpt_neo", "opt", "stablelm", "granite", "falcon", "gpt_bigcode", "mixtral",
                "olmoe", "qwen3_moe", "granitemoe", "qwen2_moe", "gpt_oss", "glm", "glm4",
                "starcoder2", "exaone", "exaone4", "cohere", "cohere2", "seed_oss", "ernie4_5",
                "helium", "arcee", "glm4_moe", "dots1", "ernie4_5_moe", "deepseek_v2",
                "deepseek_v3", "minicpm3", "llama4", "nanochat", "hunyuan_v1_dense", "vaultgemma")
#: --max_shard_size's units, as huggingface_hub reads them ("5GB" is 5 * 10**9 bytes)
UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
         "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
DEFAULT_SHARD = "5GB"  # hf.MAX_SHARD_SIZE, written as users write it (a test holds them equal)


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "export",
        help="write a checkpoint as a Hugging Face model directory",
        description="Write CHECKPOINT as a Hugging Face directory OUT (config.json, "
        "model.safetensors, tokenizer.json) for transformers' from_pretrained.",
    )
    add_checkpoint_argument(parser)
    parser.add_argument("out", metavar="OUT", help="directory to write")
    parser.add_argument("--family", choices=FAMILY_NAMES, default=None,
                        help="model_type to write (default: the family the checkpoint came "
                        "from, for a Hugging Face directory or a fine-tune of one, else the "
                        "first family that expresses the config exactly: gpt2 for attnlab's "
                        "default blocks, llama for --arch llama)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the model in OUT if it holds one")
    parser.add_argument(
        "--dtype", choices=DTYPES, default="float32",
        help="the dtype the weights are loaded and written in: bfloat16 halves the memory "
        "and the files, and loses nothing for a directory stored in bfloat16 (most hub "
        "models); float32 keeps a float32 checkpoint exact (default float32)")
    parser.add_argument(
        "--max_shard_size", type=shard_size, default=shard_size(DEFAULT_SHARD), metavar="SIZE",
        help="the largest weight file to write, e.g. 5GB, 500MB or 2GiB: a model larger than "
        "that is written as Hugging Face's shards, made and written one at a time, so the "
        f"export holds one shard beside the model (default {DEFAULT_SHARD})")
    add_force_flag(parser)
    return parser


def shard_size(text: str) -> int:
    """--max_shard_size in bytes: a whole number with an optional unit (UNITS)."""
    match = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]*)\s*", text)
    unit = match.group(2).upper() if match else ""
    if match is None or unit not in UNITS or int(match.group(1)) * UNITS[unit] < 1:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a size; write a positive whole number and a unit, e.g. 5GB, "
            "500MB or 2GiB")
    return int(match.group(1)) * UNITS[unit]


def run(args: argparse.Namespace) -> int:
    from ..checkpoint import find_checkpoint
    from ..hf import (
        FAMILY_BY_NAME,
        SHARD_FILE,
        config_to_hf,
        family_for_config,
        is_hf_dir,
        read_hf_config,
        save_hf,
    )

    out = Path(args.out)
    if find_checkpoint(out / "ckpt") is not None or (out / "ckpt").exists():
        raise CLIError(f"OUT {out} is an attnlab run (it holds ckpt/); a model written there "
                       f"would be what every command given {out} loads, not the run's "
                       "checkpoint: choose another OUT")
    if (out / "config.json").exists() and not is_hf_dir(out):
        raise CLIError(f"OUT {out} holds an attnlab checkpoint, which --overwrite would not "
                       "replace whole; choose another OUT")
    if (out / "config.json").exists() and not args.overwrite:
        raise CLIError(f"{out} already holds a model (config.json); pass --overwrite to "
                       "replace it, or choose another OUT")
    if out.exists() and not out.is_dir():
        raise CLIError(f"OUT {out} is a file; give a directory (created if missing)")
    began = time.perf_counter()
    opened = open_model(args)
    family = args.family or _source_family(opened.meta, opened.config) or \
        family_for_config(opened.config).name
    config_to_hf(opened.config, family=FAMILY_BY_NAME[family])  # one it cannot express: now
    ckpt = load_opened(args, opened, [_shard_use(opened, family, args.max_shard_size)])
    # written beside OUT's files, then moved in with the earlier export's removed: a run
    # stopped halfway leaves the earlier export whole, not its tokenizer beside new weights
    _say_writing(ckpt.model, family, args.max_shard_size)
    with written_together(out, "export", replacing=exported_files) as stage, \
            Counter("byte", "wrote", delay_s=0.0, scale=True) as progress:
        save_hf(stage, ckpt.model, ckpt.tokenizer, family=family,
                max_shard_size=args.max_shard_size, progress=progress)
        architecture = read_hf_config(stage)["architectures"][0]
        files = sorted(p.name for p in stage.iterdir())  # this export's, not OUT's others
    shards = [name for name in files if SHARD_FILE.fullmatch(name)]
    if len(shards) > 2:  # one line however many: the first and last name the count
        files = [name for name in files if name not in shards[1:-1]]
        files[files.index(shards[0])] += " ..."
    print(f"wrote    {out}/ as {architecture} ({family}) in "
          f"{time.perf_counter() - began:.1f} s: {', '.join(files)}")
    print(f"next     attnlab info {out}\n"
          f"         transformers.AutoModelForCausalLM.from_pretrained({str(out)!r})")
    return 0


#: a model of this many bytes or more takes seconds to write: a line on stderr says so first
WRITING_LINE_BYTES = 10**9


def _say_writing(model: Any, family: str, max_shard_size: int) -> None:
    """One line on stderr before a large model's weights are written (a 1B model in float32:
    ~10 s with nothing else on the screen); the bytes written follow (`save_hf`'s progress),
    in one file or many."""
    from ..hf import hf_layout
    from ..hf.files import shards_of
    from ..model.memory import gb

    sizes = {name: t.numel() * t.element_size() for name, t in hf_layout(model, family).items()}
    total = sum(sizes.values())
    if total >= WRITING_LINE_BYTES:
        shards = len(shards_of(sizes, max_shard_size))
        print(f"writing  {gb(total)} of weights as {count(shards, 'file')}", file=sys.stderr,
              flush=True)


def exported_files(out: Path) -> list[str]:
    """The files in `out` an export writes (an earlier export's, replaced by the next)."""
    from ..hf.files import SAFETENSORS_FILE, SAFETENSORS_INDEX, SHARD_FILE, TORCH_FILE
    from ..tokenizers.hf_dir import CONFIG_FILE, TOKENIZER_FILES

    names = {CONFIG_FILE, SAFETENSORS_FILE, SAFETENSORS_INDEX, TORCH_FILE, *TOKENIZER_FILES}
    return sorted(p.name for p in out.iterdir() if p.is_file() and (
        p.name in names or SHARD_FILE.fullmatch(p.name)))


def _shard_use(opened: Any, family: str, max_shard_size: int) -> Use:
    """What save_hf holds beside the model while it writes: one shard's tensors (those laid
    out as Hugging Face's own: transposed, or q/k/v joined), never more than the model's
    weights; a tensor larger than a shard is a shard of its own."""
    from ..hf import hf_layout
    from ..model.memory import Use

    numels = [t.numel() for t in hf_layout(opened.weights.model, family).values()]
    # `most` in float32 bytes: no fewer than any dtype's, so the bfloat16 advice is safe too
    return Use("the shard being written (--max_shard_size)", elements=sum(numels),
               most=max(max_shard_size, 4 * max(numels, default=0)),
               fix="a smaller --max_shard_size")


def _source_family(meta: dict[str, Any], config: Any) -> str | None:
    """The family the checkpoint came from (a Hugging Face directory, or a fine-tune of one:
    meta "family") where it still expresses the model: a Mistral without a window stays a
    Mistral, not the first family that fits (Llama)."""
    from ..hf import FAMILY_BY_NAME

    name = meta.get("family")
    family = FAMILY_BY_NAME.get(name) if isinstance(name, str) else None
    return name if family is not None and not family.misfits(config) else None
