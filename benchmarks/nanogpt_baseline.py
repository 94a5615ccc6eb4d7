"""The plain-PyTorch baseline: nanoGPT's model, optimizer and training step, as it writes them.

Written as nanoGPT (github.com/karpathy/nanoGPT, model.py and train.py) writes it, with its
CPU settings by default: one `c_attn` linear for q, k, v, SDPA with `is_causal=True`, pre-LN
blocks, exact GELU MLP, tied head, dropout 0 (its nn.Dropout(0.0) modules kept), AdamW with
decay on matrices (not fused: nanoGPT fuses only on CUDA), no compile, gradient clipping at
1.0, float32 (its `ctx` is a nullcontext on CPU), and `loss.item()` every step (log_interval=1
in its CPU recipe). Nothing in attnlab is used, so the comparison measures attnlab's code.

`python -m benchmarks.nanogpt_baseline --data FILE --out DIR` is its train.py run of
config/train_shakespeare_char.py on a GPU, re-implemented from the published settings (not
copied): 6 layers, 6 heads, 384 wide, no biases, dropout 0.2, context 256, batch 64, AdamW
lr 1e-3 betas (0.9, 0.99) weight decay 0.1, fused on CUDA, 100 warmup steps, cosine to 1e-4
at 5000, gradient clipping 1.0, bfloat16 autocast, TF32 on, torch.compile, random batches
from uint16 memmaps (pinned, copied without blocking), an evaluation of both splits every 250
steps on random batches, a checkpoint whenever val improves, `loss.item()` every 10 steps.
It prints one JSON line per evaluation and per 10 steps; `benchmarks/gpu_train.py` reads them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int, bias: bool = True, dropout: float = 0.0) -> None:
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd, bias=bias)
        self.c_proj = nn.Linear(n_embd, n_embd, bias=bias)
        self.resid_dropout = nn.Dropout(dropout)
        self.n_head, self.n_embd, self.dropout = n_head, n_embd, dropout

    def forward(self, x: Tensor) -> Tensor:
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)  # (B, T, C) each
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True
        )  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, n_embd: int, bias: bool = True, dropout: float = 0.0) -> None:
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd, bias=bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * n_embd, n_embd, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, n_embd: int, n_head: int, bias: bool = True, dropout: float = 0.0) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd, bias=bias)
        self.attn = CausalSelfAttention(n_embd, n_head, bias, dropout)
        self.ln_2 = nn.LayerNorm(n_embd, bias=bias)
        self.mlp = MLP(n_embd, bias, dropout)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class NanoGPT(nn.Module):
    def __init__(self, vocab_size: int, block_size: int, n_layer: int, n_head: int,
                 n_embd: int, bias: bool = True, dropout: float = 0.0) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.drop = nn.Dropout(dropout)
        self.h = nn.ModuleList([Block(n_embd, n_head, bias, dropout) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd, bias=bias)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.wte.weight = self.lm_head.weight
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
        _, t = idx.size()
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)  # (T,)
        x = self.drop(self.wte(idx) + self.wpe(pos))  # (B, T, C)
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))  # (B, T, V)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1),
                               ignore_index=-1)
        return logits, loss

    def configure_optimizers(self, weight_decay: float, lr: float,
                             betas: tuple[float, float], fused: bool = False) -> torch.optim.AdamW:
        params = [p for p in self.parameters() if p.requires_grad]
        groups = [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ]
        return torch.optim.AdamW(groups, lr=lr, betas=betas, fused=fused)

    def non_embedding_params(self) -> int:
        """nanoGPT's get_num_params(): every parameter but the position table."""
        return sum(p.numel() for p in self.parameters()) - self.wpe.weight.numel()


def get_batch(data: np.ndarray, batch_size: int, block_size: int) -> tuple[Tensor, Tensor]:
    """nanoGPT's get_batch: random windows from a uint16 memmap (global RNG)."""
    ix = torch.randint(len(data) - block_size, (batch_size,))
    x = torch.stack([torch.from_numpy(data[i:i + block_size].astype(np.int64)) for i in ix])
    y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + block_size].astype(np.int64))
                     for i in ix])
    return x, y


def train_step(model: NanoGPT, optimizer: torch.optim.Optimizer, data: np.ndarray,
               batch_size: int, block_size: int, grad_clip: float = 1.0) -> float:
    """One iteration of nanoGPT's train.py loop (gradient_accumulation_steps=1)."""
    x, y = get_batch(data, batch_size, block_size)
    _, loss = model(x, y)
    loss.backward()
    if grad_clip != 0.0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()


# ----------------------------------------------------------------------------- the GPU run

#: config/train_shakespeare_char.py over train.py's defaults (gradient_accumulation_steps 1)
SHAKESPEARE_CHAR: dict[str, Any] = {
    "batch_size": 64, "block_size": 256, "n_layer": 6, "n_head": 6, "n_embd": 384,
    "dropout": 0.2, "bias": False, "learning_rate": 1e-3, "max_iters": 5000,
    "lr_decay_iters": 5000, "min_lr": 1e-4, "beta1": 0.9, "beta2": 0.99, "warmup_iters": 100,
    "weight_decay": 0.1, "grad_clip": 1.0, "eval_interval": 250, "eval_iters": 200,
    "log_interval": 10, "compile": True, "seed": 1337,
}
#: --smoke: the same loop at a size a CPU runs in seconds (it checks the code, times nothing)
SMOKE: dict[str, Any] = {
    **SHAKESPEARE_CHAR, "batch_size": 4, "block_size": 32, "n_layer": 1, "n_head": 2,
    "n_embd": 32, "max_iters": 20, "lr_decay_iters": 20, "warmup_iters": 2,
    "eval_interval": 10, "eval_iters": 2, "log_interval": 5, "compile": False,
}


def prepare(text_path: str | Path, data_dir: str | Path) -> int:
    """nanoGPT's data/shakespeare_char/prepare.py: the text's characters, sorted, are the ids;
    the first 90% go to train.bin, the rest to val.bin (uint16). Returns the vocabulary size."""
    text = Path(text_path).read_text(encoding="utf-8")
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    ids = np.array([stoi[c] for c in text], dtype=np.uint16)
    n = len(ids)
    Path(data_dir).mkdir(parents=True, exist_ok=True)
    ids[: int(n * 0.9)].tofile(Path(data_dir) / "train.bin")
    ids[int(n * 0.9):].tofile(Path(data_dir) / "val.bin")
    (Path(data_dir) / "vocab_size").write_text(str(len(chars)))
    return len(chars)


def lr_at(it: int, s: dict[str, Any]) -> float:
    """nanoGPT's get_lr: linear warmup, cosine decay to min_lr at lr_decay_iters."""
    if it < s["warmup_iters"]:
        return float(s["learning_rate"] * (it + 1) / (s["warmup_iters"] + 1))
    if it > s["lr_decay_iters"]:
        return float(s["min_lr"])
    ratio = (it - s["warmup_iters"]) / (s["lr_decay_iters"] - s["warmup_iters"])
    coeff = 0.5 * (1.0 + math.cos(math.pi * ratio))
    return float(s["min_lr"] + coeff * (s["learning_rate"] - s["min_lr"]))


def _emit(event: dict[str, Any]) -> None:
    print(json.dumps(event), flush=True)


def train_run(data_dir: Path, out_dir: Path, s: dict[str, Any], device: torch.device) -> None:
    """train.py's loop with settings `s` (SHAKESPEARE_CHAR): an evaluation every
    eval_interval steps (printed before its checkpoint is written), tokens/s every
    log_interval steps, until step max_iters."""
    torch.manual_seed(s["seed"])
    cuda = device.type == "cuda"
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    bf16 = cuda and torch.cuda.is_bf16_supported()
    ctx: Any = torch.autocast("cuda", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
    B, T = s["batch_size"], s["block_size"]

    def get_batch(split: str) -> tuple[Tensor, Tensor]:
        data = np.memmap(data_dir / f"{split}.bin", dtype=np.uint16, mode="r")  # as train.py
        ix = torch.randint(len(data) - T, (B,))
        x = torch.stack([torch.from_numpy(data[i:i + T].astype(np.int64)) for i in ix])
        y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + T].astype(np.int64)) for i in ix])
        if cuda:
            return (x.pin_memory().to(device, non_blocking=True),
                    y.pin_memory().to(device, non_blocking=True))
        return x, y

    vocab = int((data_dir / "vocab_size").read_text())
    model = NanoGPT(vocab, T, s["n_layer"], s["n_head"], s["n_embd"], s["bias"],
                    s["dropout"]).to(device)
    optimizer = model.configure_optimizers(s["weight_decay"], s["learning_rate"],
                                           (s["beta1"], s["beta2"]), fused=cuda)
    forward: Any = torch.compile(model) if s["compile"] else model
    _emit({"event": "model", "non_embedding_params": model.non_embedding_params(),
           "device": str(device), "bf16": bf16, "compile": s["compile"]})

    @torch.no_grad()
    def estimate_loss() -> dict[str, float]:
        model.eval()
        out = {}
        for split in ("train", "val"):
            losses = torch.zeros(s["eval_iters"])
            for k in range(s["eval_iters"]):
                x, y = get_batch(split)
                with ctx:
                    _, loss = forward(x, y)
                losses[k] = loss.item()
            out[split] = float(losses.mean())
        model.train()
        return out

    x, y = get_batch("train")
    best, it = math.inf, 0
    t_log, since = time.perf_counter(), 0
    while True:
        for group in optimizer.param_groups:
            group["lr"] = lr_at(it, s)
        if it % s["eval_interval"] == 0:
            losses = estimate_loss()
            _emit({"event": "eval", "step": it, "train": losses["train"], "val": losses["val"],
                   "time": time.time()})
            if losses["val"] < best:  # always_save_checkpoint = False: only improvements
                best = losses["val"]
                if it > 0:
                    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                                "iter_num": it, "best_val_loss": best}, out_dir / "ckpt.pt")
            t_log, since = time.perf_counter(), it  # throughput counts training steps only
        with ctx:
            _, loss = forward(x, y)
        x, y = get_batch("train")  # the next batch loads while the GPU works
        loss.backward()
        if s["grad_clip"] != 0.0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), s["grad_clip"])
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        it += 1
        if it % s["log_interval"] == 0:
            lossf = loss.item()  # the one sync per log_interval steps
            now = time.perf_counter()
            _emit({"event": "log", "step": it, "loss": lossf,
                   "tokens_per_s": B * T * (it - since) / (now - t_log)})
            t_log, since = now, it
        if it > s["max_iters"]:
            break


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.nanogpt_baseline",
                                     description=__doc__.split("\n\n")[2])
    parser.add_argument("--data", required=True, help="the text (tiny Shakespeare)")
    parser.add_argument("--out", required=True, help="directory for the bins and ckpt.pt")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--eval_iters", type=int, help="batches per split per evaluation")
    parser.add_argument("--max_iters", type=int, help="steps (the schedule keeps 5000)")
    parser.add_argument("--no-compile", dest="compile", action="store_false")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, on any device")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    s = dict(SMOKE if args.smoke else SHAKESPEARE_CHAR)
    s["compile"] = s["compile"] and args.compile
    for key in ("eval_iters", "max_iters"):
        if getattr(args, key) is not None:
            s[key] = getattr(args, key)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if not (out / "val.bin").exists():  # prepare.py runs before train.py
        prepare(args.data, out)
    train_run(out, out, s, torch.device(args.device))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
