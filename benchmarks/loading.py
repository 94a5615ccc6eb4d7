"""Loading: big model directories described and loaded without taking the machine down.

- `attnlab info` on a Llama-3.1-70B-shaped Hugging Face directory (config.json, 8 bf16
  safetensors shards and their index; 141 GB of weights written as sparse files, so it costs
  a few MB of disk): seconds and peak RSS of the whole process.
- `attnlab generate` on it: the one line it answers with on a machine that cannot hold it.
- A lazy load of a real random model (Llama-shaped, ~2.5 GB in bfloat16, 4 shards), into
  bfloat16 on the CPU: seconds, peak RSS, and (peak - the RSS before the load) against the
  model's bytes, which attnlab's loader keeps within 1.25x (docs/performance.md#lazy-loading).
- The same model from an FP8 release of it (every matrix e4m3 in 128 x 128 blocks), each
  matrix dequantized as it is read (docs/models.md#fp8-checkpoints), and with the matrices
  kept FP8 (`packed=True`): the same measures, the model's bytes, and a 32-token forward of
  each.

Every workload runs in a fresh subprocess whose own VmHWM is its peak. `sparse_hf_dir`
builds the directories; the tests use it too.
"""

from __future__ import annotations

import json
import math
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from .common import machine, table

LLAMA_70B: dict[str, Any] = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 8192,
    "intermediate_size": 28672, "num_hidden_layers": 80, "num_attention_heads": 64,
    "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": False,
    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                     "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
    "torch_dtype": "bfloat16", "bos_token_id": 128000, "eos_token_id": 128001,
}
# ~1.2B parameters: 2.5 GB in bfloat16, its largest tensor (the head) 4% of it
LLAMA_1B = {**LLAMA_70B, "hidden_size": 2048, "intermediate_size": 8192,
            "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
            "vocab_size": 32000, "max_position_embeddings": 4096, "rope_scaling": None}
#: a small tokenizer.json (11 ids) the tests keep
TOKENIZER = Path(__file__).resolve().parents[1] / "tests" / "data" / "v0.2_hf_llama" / (
    "tokenizer.json")
SAFETENSORS_NAMES = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32",
                     torch.uint8: "U8"}


def hf_shapes(hf_config: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """Hugging Face tensor name -> shape for a config, from a meta-device model."""
    from attnlab.hf import config_from_hf, family_of
    from attnlab.model.materialize import meta_gpt

    config = config_from_hf(hf_config)
    hf = family_of(hf_config).weights.to_hf(meta_gpt(config).state_dict(), config)
    return {name: tuple(t.shape) for name, t in hf.items()}


def write_safetensors(path: Path, shapes: Mapping[str, tuple[int, ...]],
                      dtype: torch.dtype = torch.bfloat16, seed: int | None = None,
                      fill: bytes | None = None) -> None:
    """A safetensors file of `shapes`: random normal values (std 0.02) when `seed` is given,
    the bytes of `fill` repeated when that is (fast at any size), else a sparse file whose
    data reads as zeros and takes no disk."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape in shapes.items():
        nbytes = math.prod(shape) * dtype.itemsize
        header[name] = {"dtype": SAFETENSORS_NAMES[dtype], "shape": list(shape),
                        "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)  # data aligned to 8 bytes, as safetensors writes it
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        if fill is not None:
            for left in range(offset, 0, -len(fill)):
                f.write(fill[:left])
            return
        if seed is None:
            f.truncate(8 + len(text) + offset)
            return
        generator = torch.Generator().manual_seed(seed)
        for shape in shapes.values():
            values = torch.randn(shape, generator=generator).mul_(0.02).to(dtype)
            f.write(values.reshape(-1).view(torch.uint8).numpy().tobytes())


def sparse_hf_dir(directory: Path, hf_config: Mapping[str, Any], *, shards: int = 8,
                  dtype: torch.dtype = torch.bfloat16, seed: int | None = None,
                  fill: bytes | None = None) -> Path:
    """A Hugging Face model directory for `hf_config`: config.json, `shards` safetensors
    shards and their index (sparse unless `seed` or `fill` gives values: write_safetensors)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(hf_config, indent=2))
    shapes = hf_shapes(hf_config)
    names = list(shapes)
    per = math.ceil(len(names) / shards)
    weight_map = {}
    for i in range(shards):
        part = names[i * per:(i + 1) * per]
        shard = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        write_safetensors(directory / shard, {n: shapes[n] for n in part}, dtype,
                          None if seed is None else seed + i, fill)
        weight_map.update(dict.fromkeys(part, shard))
    (directory / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return directory


def fp8_hf_dir(directory: Path, hf_config: Mapping[str, Any], *, shards: int = 4,
               seed: int = 0) -> Path:
    """`sparse_hf_dir`'s model with random values (std 0.02) and every matrix inside the
    blocks stored as FP8 in 128 x 128 blocks (`model.fp8.quantize_fp8`), the rest bfloat16, as
    an FP8 release stores them."""
    from safetensors.torch import save_file

    from attnlab.hf.fp8 import FP8
    from attnlab.model.fp8 import quantize_fp8

    directory.mkdir(parents=True, exist_ok=True)
    shapes = hf_shapes(hf_config)
    names = list(shapes)
    per = math.ceil(len(names) / shards)
    generator = torch.Generator().manual_seed(seed)
    weight_map = {}
    for i in range(shards):
        shard, tensors = f"model-{i + 1:05d}-of-{shards:05d}.safetensors", {}
        for name in names[i * per:(i + 1) * per]:
            values = torch.randn(shapes[name], generator=generator).mul_(0.02)
            if values.dim() == 2 and ".layers." in name:
                tensors[name], tensors[name + "_scale_inv"] = quantize_fp8(values, (128, 128))
            else:
                tensors[name] = values.to(torch.bfloat16)
        save_file(tensors, str(directory / shard), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, shard))
    config = {**hf_config, "quantization_config": {
        "quant_method": FP8, "fmt": "e4m3", "weight_block_size": [128, 128],
        "activation_scheme": "dynamic"}}
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    (directory / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return directory


_REPORT = """
with open("/proc/self/status") as status:
    peak_kb = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
print(json.dumps({"peak_mb": peak_kb / 1024, **result}))
"""
CLI_RUN = """
import json, sys, time
from attnlab.cli import main
t0 = time.perf_counter()
code = main({argv!r})
result = {{"seconds": time.perf_counter() - t0, "exit": code}}
"""
LOAD_RUN = """
import json, time, torch
from attnlab import load_hf
def rss_mb():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:")) / 1024
before = rss_mb()
t0 = time.perf_counter()
model = load_hf({path!r}, torch.bfloat16, packed={packed!r})
seconds = time.perf_counter() - t0
with open("/proc/self/status") as status:  # the load's peak, before the forward's
    load_peak = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
model_mb = sum(t.nbytes for t in (*model.parameters(), *model.buffers())) / 2**20
ids = torch.arange(32)[None] % model.config.vocab_size
with torch.no_grad():
    model(ids)  # warm
    t0 = time.perf_counter()
    model(ids)
forward = time.perf_counter() - t0
result = {{"seconds": seconds, "before_mb": before, "model_mb": model_mb, "forward": forward,
          "peak_mb": load_peak / 1024}}
"""


def measure(code: str, **fields: Any) -> dict[str, Any]:
    """Run `code` in a fresh Python; its last line of stdout, parsed, plus its stderr."""
    proc = subprocess.run([sys.executable, "-c", code.format(**fields) + _REPORT],
                          capture_output=True, text=True, timeout=600)
    if not proc.stdout.strip():
        raise RuntimeError(f"workload failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), "stderr": proc.stderr.strip()}


def run(quick: bool = False) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        big = sparse_hf_dir(Path(tmp) / "llama-70b", LLAMA_70B)
        # a small tokenizer beside it: commands read the tokenizer before the weights
        (big / "tokenizer.json").write_bytes(TOKENIZER.read_bytes())
        info = measure(CLI_RUN, argv=["info", str(big)])
        gen = measure(CLI_RUN, argv=["generate", str(big), "hat", "--max_new_tokens", "1"])
        small = {**LLAMA_1B, "num_hidden_layers": 2} if quick else LLAMA_1B
        t0 = time.perf_counter()
        real = sparse_hf_dir(Path(tmp) / "llama-1b", small, shards=4, seed=0)
        written = time.perf_counter() - t0
        load = measure(LOAD_RUN, path=str(real), packed=False)
        fp8_dir = fp8_hf_dir(Path(tmp) / "llama-1b-fp8", small)
        fp8 = measure(LOAD_RUN, path=str(fp8_dir), packed=False)
        kept = measure(LOAD_RUN, path=str(fp8_dir), packed=True)
    load_peak = load["peak_mb"] - load["before_mb"]
    fp8_peak = fp8["peak_mb"] - fp8["before_mb"]
    rows = [
        ["attnlab info, Llama-3.1-70B shape (141 GB bf16, sparse)", info["seconds"],
         info["peak_mb"], f"exit {info['exit']}"],
        ["attnlab generate on it", gen["seconds"], gen["peak_mb"],
         gen["stderr"].splitlines()[-1]],
        [f"load_hf bf16, random Llama shape ({load['model_mb'] / 1024:.2f} GiB)",
         load["seconds"], load["peak_mb"],
         f"peak - before = {load_peak / load['model_mb']:.3f}x the model"],
        ["load_hf bf16 from its FP8 release (matrices e4m3, 128 x 128 blocks), dequantized",
         fp8["seconds"], fp8["peak_mb"],
         f"peak - before = {fp8_peak / fp8['model_mb']:.3f}x the model"],
        ["load_hf bf16 from it, packed=True: the matrices kept FP8", kept["seconds"],
         kept["peak_mb"], f"model {kept['model_mb']:,.0f} MB, "
         f"{kept['model_mb'] / fp8['model_mb']:.2f}x the dequantized one"],
    ]
    forward_rows = [
        [f"32-token forward, matrices {name}", run["forward"]]
        for name, run in (("dequantized from FP8", fp8), ("kept FP8", kept))]
    columns = ["workload", "seconds", "peak RSS MB", "result"]
    return {"suite": "loading", "machine": machine(), "written_seconds": round(written, 1),
            "load": load, "fp8_load": fp8, "fp8_kept": kept,
            "tables": [table("Big model directories", columns, rows),
                       table("A model from FP8 files, bfloat16", ["workload", "seconds"],
                             forward_rows)]}
