"""`attnlab info CHECKPOINT`: what a model directory holds, from its metadata alone
(`attnlab.inspect_dir`): never the tensors, so a 70B directory answers at once."""

from __future__ import annotations

import argparse
import json
import reprlib
import sys
from typing import Any

from ..checkpoint import train_state_problem
from ..generate.memory import cache_numbers
from ..model.config import GPTConfig
from ..model.memory import gb
from ..model.moe import idle_parameters
from .common import add_checkpoint_argument, count


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "info",
        help="print a model directory's config, size, tokenizer and training state",
        description="Print the model config, parameter count, stored bytes per dtype, what "
        "loading needs at each dtype, the tokenizer, generation settings and training state "
        "of CHECKPOINT, from its metadata alone (config.json, the weight files' headers and "
        "the tokenizer files: instant for a model of any size).",
    )
    add_checkpoint_argument(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object instead")
    return parser


def run(args: argparse.Namespace) -> int:
    from ..load import inspect_dir

    model = inspect_dir(args.checkpoint)
    for note in model.notes:
        print(f"note: {note}", file=sys.stderr)
    info = _as_dict(model)
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    _print(model, info)
    return 0


def _as_dict(model: Any) -> dict[str, Any]:
    """The JSON `attnlab info --json` prints."""
    tok, meta = model.tokenizer, model.meta
    memory = {"cpu": model.memory("cpu")}
    import torch

    if torch.cuda.is_available():
        memory["cuda"] = model.memory("cuda")
    return {
        "path": str(model.path),
        "source": model.source,
        "family": model.family,
        "architecture": model.architecture,
        "config": model.config.to_dict(),
        "parameters": model.parameters,
        "active_parameters": model.parameters - idle_parameters(model.config),  # per token
        "kv_cache_numbers": cache_numbers(model.config),  # a token, every layer's
        "stored": model.stored,
        "tensors": model.tensors,
        "weight_files": model.weight_files,
        "largest_tensor": model.largest_tensor,  # bytes: what a load holds beside the model
        "memory": memory,
        "tokenizer": tok and {"name": tok.name, "vocab_size": tok.vocab_size,
                              "stop_ids": list(tok.stop_ids),
                              "bos_id": getattr(tok, "bos_id", None),
                              "adds_bos": bool(getattr(tok, "add_bos", False))},
        "generation": model.generation,
        "step": meta.get("step"),
        "val_loss": meta.get("val_loss"),
        "dataset": meta.get("dataset"),
        "train_config": meta.get("train_config") or {},
        "resumable": model.resumable and train_state_problem(model.path) is None,
        "bytes": sum(p.stat().st_size for p in model.path.iterdir() if p.is_file()),
        "notes": model.notes,
    }


_CUT = reprlib.Repr()
_CUT.maxlist = 6  # longrope's factor lists: 48 numbers each in Phi-4-mini (--json has all)


def _value(value: Any) -> str:
    """A config value as the config line shows it: lists within cut short, the rest as is."""
    return _CUT.repr(value) if isinstance(value, dict | list) else str(value)


def _print(model: Any, info: dict[str, Any]) -> None:
    meta, tok, c = model.meta, model.tokenizer, info["config"]
    print(f"checkpoint  {info['path']}  ({gb(info['bytes'])})")
    active = (f" ({info['active_parameters']:,} active per token)"
              if info["active_parameters"] != info["parameters"] else "")
    latent = f" (latent attention, k and v from {c['kv_latent']} dims)" if c.get(
        "kv_latent") else ""
    print(f"model       {count(c['n_layer'], 'layer')}, {count(c['n_head'], 'head')}{latent}, "
          f"{c['n_embd']} dims, context {c['block_size']}, vocab {c['vocab_size']}: "
          f"{info['parameters']:,} parameters{active}")
    print("config      " + ", ".join(f"{k}={_value(v)}" for k, v in c.items()))
    if meta.get("init_from"):  # a fine-tune (attnlab train --init_from)
        family = f" (Hugging Face {meta['family']})" if meta.get("family") else ""
        print(f"fine-tuned  from {meta['init_from']}{family}")
    elif model.family:  # a Hugging Face directory
        print(f"family      {model.architecture} (Hugging Face {model.family} directory)")
    stored = ", ".join(f"{dtype} {gb(n)}" for dtype, n in info["stored"].items())
    print(f"weights     {stored} in {count(len(info['weight_files']), 'file')} "
          f"({count(info['tensors'], 'tensor')})")
    for device, report in info["memory"].items():
        print(f"{'loading':<12}{_memory_line(device, report)}")
    print(f"kv cache    {_cache_line(model.config, info['kv_cache_numbers'])}")
    if tok is None:
        print("tokenizer   none")
    else:
        print(f"tokenizer   {tok.name} ({tok.vocab_size} ids)" + _specials(tok, info["tokenizer"]))
    if model.generation:
        print("generation  " + ", ".join(f"{k}={v}" for k, v in model.generation.items()))
    if info["step"] is not None:
        val = "" if info["val_loss"] is None else f", val loss {info['val_loss']:.4f}"
        if meta.get("val_bpb") is not None:
            val += f" ({meta['val_bpb']:.3f} bits/byte)"
        if val and meta.get("val_step") not in (None, info["step"]):  # an interrupted run's
            val += f" at step {meta['val_step']}"
        print(f"trained     {count(info['step'], 'step')} on {info['dataset']}{val}")
    if info["train_config"]:
        print("train       " + ", ".join(f"{k}={v}" for k, v in info["train_config"].items()))
    if model.source == "attnlab":
        why = "no training state saved" if not model.resumable else train_state_problem(model.path)
        print(f"resumable   {'yes' if info['resumable'] else f'no ({why})'}")


def _cache_line(c: GPTConfig, numbers: int) -> str:
    """"327.7 kB a token in bfloat16 (80 layers of k and v, 8 heads x 128), 42.9 GB for
    the whole context (131,072)": what a generation's cache adds beside the weights."""
    each = (f"a latent of {c.kv_latent} and a RoPE part of {c.rope_head_dim}"
            if c.kv_latent is not None else
            f"k and v, {count(c.n_kv_heads, 'head')} x {c.head_size}")
    return (f"{gb(2 * numbers)} a token in bfloat16 ({count(c.n_layer, 'layer')} of "
            f"{each}), {gb(2 * numbers * c.block_size)} for the whole context "
            f"({c.block_size:,})")


def _memory_line(device: str, report: dict[str, dict[str, Any]]) -> str:
    """"on cpu: float32 282.2 GB (too big), bfloat16 141.1 GB (too big), ..." """
    verdict = {True: "fits", False: "too big", None: "free memory unknown"}
    return f"on {device}: " + ", ".join(
        f"{dtype} {gb(r['bytes'])} ({verdict[r['fits']]})" for dtype, r in report.items())


def _specials(tok: Any, about: dict[str, Any]) -> str:
    """"; generation stops at '</s>' (2); '<s>' (1) prepended" for the tokenizer line."""
    def named(i: int, role: str) -> str:
        try:
            return f"{tok.decode([i])!r} ({i})"
        except ValueError:  # a config's id past the tokenizer: say so, finish the report
            return f"{role} id {i} (not in the tokenizer)"

    text = ""
    if about["stop_ids"]:
        text += "; generation stops at " + " or ".join(named(i, "eos")
                                                       for i in about["stop_ids"])
    if about["adds_bos"] and about["bos_id"] is not None:
        text += f"; {named(about['bos_id'], 'bos')} prepended"
    return text
