"""gpt-oss-20b, experts packed: the released model's shape run where its bfloat16 weights
(43 GB with the largest tensor read on the way) cannot fit, its MXFP4 experts kept packed
in memory (`attnlab.model.mxfp4.Mxfp4Linear`: 15 GB).

A directory of gpt-oss-20b's config.json and tensors (random: float tensors drawn at std
0.02, expert bytes a repeated random pattern with scale bytes 119..121, so weights stay
within +-0.05; about 14 GB of disk) is written once under the results' temporary directory,
then a fresh Python loads it with `load_hf(..., torch.bfloat16, packed=True)`, runs a
forward over a prompt and generates greedily with the KV cache: seconds, tokens/s and the
process's peak RSS against the model's bytes. Skipped, in one line, where the disk or the
memory lacks room; `--quick` writes and runs two of its 24 layers.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from .common import machine, note, table
from .loading import hf_shapes, measure, write_safetensors

# gpt-oss-20b's config.json as released (openai/gpt-oss-20b), its 24 layer types spelled out
GPT_OSS_20B: dict[str, Any] = {
    "architectures": ["GptOssForCausalLM"], "attention_bias": True, "attention_dropout": 0.0,
    "eos_token_id": 200002, "experts_per_token": 4, "head_dim": 64, "hidden_act": "silu",
    "hidden_size": 2880, "initial_context_length": 4096, "initializer_range": 0.02,
    "intermediate_size": 2880,
    "layer_types": ["sliding_attention", "full_attention"] * 12,
    "max_position_embeddings": 131072, "model_type": "gpt_oss", "num_attention_heads": 64,
    "num_experts_per_tok": 4, "num_hidden_layers": 24, "num_key_value_heads": 8,
    "num_local_experts": 32, "output_router_logits": False, "pad_token_id": 199999,
    "quantization_config": {"modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens",
        "lm_head"], "quant_method": "mxfp4"},
    "rms_norm_eps": 1e-05, "rope_scaling": {
        "beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
        "original_max_position_embeddings": 4096, "rope_type": "yarn", "truncate": False},
    "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 128,
    "swiglu_limit": 7.0, "tie_word_embeddings": False, "transformers_version": "4.55.0.dev0",
    "use_cache": True, "vocab_size": 201088,
}
EXPERTS = ("gate_up_proj", "down_proj")  # the tensors the checkpoints store as MXFP4
FILES = ("model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
         "model-00003-of-00003.safetensors")
PROMPT, NEW = 32, 8  # tokens
RUN = """
import json, time, torch
from attnlab import load_hf
from attnlab.generate import generate
from attnlab.model.mxfp4 import packed_layers, packed_size
torch.manual_seed(0)
t0 = time.perf_counter()
model = load_hf({path!r}, torch.bfloat16, packed=True)
load_s = time.perf_counter() - t0
packed = packed_layers(model)
model_bytes = sum(p.nbytes for p in model.parameters()) + packed_size(model)[1]
ids = torch.randint(0, model.config.vocab_size, (1, {prompt}))
with torch.no_grad():
    t0 = time.perf_counter()
    out = model(ids)
    forward_s = time.perf_counter() - t0
out = out[0] if isinstance(out, tuple) else out
t0 = time.perf_counter()
new = generate(model, ids, max_new_tokens={new}, temperature=0)
generate_s = time.perf_counter() - t0
result = {{"load_s": load_s, "forward_s": forward_s, "generate_s": generate_s,
           "parameters": model.num_params(False), "packed_layers": len(packed),
           "model_mb": model_bytes / 2**20, "new": int(new.shape[1]) - {prompt},
           "finite": bool(torch.isfinite(out).all())}}
"""


def packed_hf_dir(directory: Path, hf_config: Mapping[str, Any], *, sparse: bool = True
                  ) -> Path:
    """A gpt-oss directory as released: config.json, the float tensors in one shard, the
    experts' MXFP4 blocks and scales in two more, and the index. `sparse`: files that read
    as zeros and take no disk (for `inspect_dir`); else random weights (module docstring)."""
    directory.mkdir(parents=True, exist_ok=True)
    shapes = hf_shapes({k: v for k, v in hf_config.items() if k != "quantization_config"})
    floats, blocks, scales = {}, {}, {}
    for name, shape in shapes.items():
        if name.endswith(EXPERTS):  # (E, in, out) -> blocks (E, out, in / 32, 16), scales
            E, n_in, n_out = shape
            blocks[f"{name}_blocks"] = (E, n_out, n_in // 32, 16)
            scales[f"{name}_scales"] = (E, n_out, n_in // 32)
        else:
            floats[name] = shape
    pattern = torch.randint(0, 256, (1 << 20,), generator=torch.Generator().manual_seed(1),
                            dtype=torch.uint8).numpy().tobytes()
    write_safetensors(directory / FILES[0], floats, seed=None if sparse else 0)
    write_safetensors(directory / FILES[1], blocks, torch.uint8,
                      fill=None if sparse else pattern)
    write_safetensors(directory / FILES[2], scales, torch.uint8,
                      fill=None if sparse else bytes([119, 120, 121, 120]))
    index = {name: file for file, part in zip(FILES, (floats, blocks, scales), strict=True)
             for name in part}
    (directory / "model.safetensors.index.json").write_text(json.dumps({"weight_map": index}))
    (directory / "config.json").write_text(json.dumps(hf_config))
    return directory


def _room(quick: bool) -> str | None:
    """Why this machine cannot run the case, or None."""
    from attnlab.model.memory import available_bytes

    disk = shutil.disk_usage(tempfile.gettempdir()).free
    memory = available_bytes("cpu") or 0
    need_disk, need_memory = (3e9, 3e9) if quick else (16e9, 17e9)
    if disk < need_disk or memory < need_memory:
        return (f"needs {need_disk / 1e9:.0f} GB of disk and {need_memory / 1e9:.0f} GB of "
                f"memory free, has {disk / 1e9:.1f} and {memory / 1e9:.1f}; skipped")
    return None


def run(quick: bool = False) -> dict[str, Any]:
    why = _room(quick)
    if why is not None:
        return {"suite": "gpt_oss", "skipped": why}
    hf_config = {**GPT_OSS_20B, "num_hidden_layers": 2,
                 "layer_types": GPT_OSS_20B["layer_types"][:2]} if quick else GPT_OSS_20B
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        directory = packed_hf_dir(Path(tmp) / "gpt-oss-20b", hf_config, sparse=False)
        written = time.perf_counter() - t0
        disk = sum(os.path.getsize(directory / f) for f in FILES)
        note(f"gpt_oss: wrote {disk / 1e9:.1f} GB in {written:.0f} s; loading it")
        r = measure(RUN, path=str(directory), prompt=PROMPT, new=NEW)
    rows = [
        ["load_hf bf16, packed=True", f"{r['load_s']:.1f} s",
         f"{r['parameters'] / 1e9:.2f}B parameters, {r['packed_layers']:,} packed matrices"],
        [f"forward, {PROMPT} tokens", f"{r['forward_s']:.1f} s",
         f"{PROMPT / r['forward_s']:.1f} tokens/s"],
        [f"generate {NEW} tokens (greedy, KV cache)", f"{r['generate_s']:.1f} s",
         f"{r['new'] / r['generate_s']:.2f} tokens/s (prefill included)"],
        ["peak RSS", f"{r['peak_mb'] / 1024:.1f} GiB",
         f"the model {r['model_mb'] / 1024:.1f} GiB; logits finite: {r['finite']}"],
    ]
    title = "gpt-oss-20b (random weights), MXFP4 experts packed, bfloat16" + (
        ", 2 layers (quick)" if quick else "")
    return {"suite": "gpt_oss", "machine": machine(), "written_seconds": round(written, 1),
            "disk_bytes": disk, "run": r,
            "tables": [table(title, ["workload", "time", "result"], rows)]}
