"""`attnlab info CHECKPOINT`: what a checkpoint holds, without loading more than it must."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from .common import add_checkpoint_argument, count


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "info",
        help="print a checkpoint's config, parameter count and training state",
        description="Print the model config, parameter count, tokenizer and training "
        "state of CHECKPOINT.",
    )
    add_checkpoint_argument(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object instead")
    return parser


def run(args: argparse.Namespace) -> int:
    from ..checkpoint import STATE_FILE
    from ..load import load_checkpoint
    from ..tokenizers import NoTokenizerError, Tokenizer

    tok: Tokenizer | None
    try:
        ckpt = load_checkpoint(args.checkpoint)
        model, meta, tok, path = ckpt.model, ckpt.meta, ckpt.tokenizer, ckpt.path
    except NoTokenizerError as err:  # a weights-only Hugging Face directory: say so, go on
        from ..hf import load_hf

        print(f"note: {err}", file=sys.stderr)
        model, meta, tok, path = load_hf(args.checkpoint), {}, None, Path(args.checkpoint)
    assert path is not None
    state_file = path / STATE_FILE
    train_config = meta.get("train_config") or {}
    info: dict[str, Any] = {
        "path": str(path),
        "config": model.config.to_dict(),
        "parameters": model.num_params(non_embedding=False),
        "tokenizer": tok and {"name": tok.name, "vocab_size": tok.vocab_size,
                              "stop_ids": list(tok.stop_ids),
                              "bos_id": getattr(tok, "bos_id", None),
                              "adds_bos": bool(getattr(tok, "add_bos", False))},
        "step": meta.get("step"),
        "val_loss": meta.get("val_loss"),
        "dataset": meta.get("dataset"),
        "train_config": train_config,
        "resumable": state_file.exists(),
        "bytes": sum(p.stat().st_size for p in path.iterdir() if p.is_file()),
    }
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    c = info["config"]
    print(f"checkpoint  {info['path']}  ({info['bytes'] / 1e6:.2f} MB)")
    print(f"model       {count(c['n_layer'], 'layer')}, {count(c['n_head'], 'head')}, "
          f"{c['n_embd']} dims, context {c['block_size']}, vocab {c['vocab_size']}: "
          f"{info['parameters']:,} parameters")
    print("config      " + ", ".join(f"{k}={v}" for k, v in c.items()))
    if meta.get("init_from"):  # a fine-tune (attnlab train --init_from)
        family = f" (Hugging Face {meta['family']})" if meta.get("family") else ""
        print(f"fine-tuned  from {meta['init_from']}{family}")
    elif meta.get("family"):  # a Hugging Face directory
        print(f"family      {meta['architecture']} (Hugging Face {meta['family']} directory)")
    if tok is None:
        print("tokenizer   none")
    else:
        print(f"tokenizer   {tok.name} ({tok.vocab_size} ids)" + _specials(tok, info["tokenizer"]))
    if info["step"] is not None:
        val = "" if info["val_loss"] is None else f", val loss {info['val_loss']:.4f}"
        if meta.get("val_bpb") is not None:
            val += f" ({meta['val_bpb']:.3f} bits/byte)"
        if val and meta.get("val_step") not in (None, info["step"]):  # an interrupted run's
            val += f" at step {meta['val_step']}"
        print(f"trained     {count(info['step'], 'step')} on {info['dataset']}{val}")
    if train_config:
        print("train       " + ", ".join(f"{k}={v}" for k, v in train_config.items()))
    print(f"resumable   {'yes' if info['resumable'] else 'no (no training state saved)'}")
    return 0


def _specials(tok: Any, about: dict[str, Any]) -> str:
    """"; generation stops at '</s>' (2); '<s>' (1) prepended" for the tokenizer line."""
    def named(i: int) -> str:
        return f"{tok.decode([i])!r} ({i})"

    text = ""
    if about["stop_ids"]:
        text += "; generation stops at " + " or ".join(map(named, about["stop_ids"]))
    if about["adds_bos"] and about["bos_id"] is not None:
        text += f"; {named(about['bos_id'])} prepended"
    return text
