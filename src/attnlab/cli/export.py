"""`attnlab export CHECKPOINT OUT [--family NAME] [--dtype bfloat16]`: write a checkpoint as a
Hugging Face model directory (config.json, model.safetensors, tokenizer.json) that
transformers' `AutoModelForCausalLM.from_pretrained(OUT)` and every attnlab command load.
The weights are written in the dtype they were loaded in (--dtype).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from .common import (
    DTYPES,
    CLIError,
    add_checkpoint_argument,
    add_force_flag,
    load_opened,
    open_model,
)

# hf.FAMILIES' names, listed here so `attnlab --help` imports nothing heavy (a test holds them
# equal)
FAMILY_NAMES = ("gpt2", "llama", "mistral", "qwen2", "qwen3", "gpt_neox")


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
    add_force_flag(parser)
    return parser


def run(args: argparse.Namespace) -> int:
    from ..checkpoint import find_checkpoint
    from ..hf import family_for_config, is_hf_dir, read_hf_config, save_hf
    from ..model.memory import Use

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
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()} if out.is_dir() else {}
    opened = open_model(args)
    # save_hf writes a contiguous copy of every tensor (hf registry: WeightMap.to_hf), held
    # with the model until the file is written
    copy = Use("the copy of the weights written out",
               elements=opened.weights.model.num_params(non_embedding=False))
    ckpt = load_opened(args, opened, [copy])
    family = args.family or _source_family(ckpt) or family_for_config(ckpt.model.config).name
    save_hf(out, ckpt.model, ckpt.tokenizer, family=family)
    architecture = read_hf_config(out)["architectures"][0]
    files = sorted(p.name for p in out.iterdir()  # what this export wrote, not OUT's others
                   if p.is_file() and before.get(p.name) != p.stat().st_mtime_ns)
    print(f"wrote    {out}/ as {architecture} ({family}) in "
          f"{time.perf_counter() - began:.1f} s: {', '.join(files)}")
    print(f"next     attnlab info {out}\n"
          f"         transformers.AutoModelForCausalLM.from_pretrained({str(out)!r})")
    return 0


def _source_family(ckpt: Any) -> str | None:
    """The family the checkpoint came from (a Hugging Face directory, or a fine-tune of one:
    meta "family") where it still expresses the model: a Mistral without a window stays a
    Mistral, not the first family that fits (Llama)."""
    from ..hf import FAMILY_BY_NAME

    name = ckpt.meta.get("family")
    family = FAMILY_BY_NAME.get(name) if isinstance(name, str) else None
    return name if family is not None and not family.misfits(ckpt.model.config) else None

