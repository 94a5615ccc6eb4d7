"""Decode speed on modern-family shapes: attnlab `generate` against Hugging Face `generate`
on a SmolLM-135M-shaped (LlamaForCausalLM: 30 layers, 9 heads, 3 kv heads, 576 dims,
d_ff 1536, vocab 49152, tied) and a Qwen2.5-0.5B-shaped (Qwen2ForCausalLM: 24 layers,
14 heads, 2 kv heads, 896 dims, d_ff 4864, vocab 151936, rope_theta 1e6, q/k/v bias, tied)
random model. transformers builds each from its config; attnlab gets the same weights
through its own import path (`attnlab.hf.gpt_from_hf`, what `load_hf` runs after reading
the files). Timing, greedy-id check and ratio (HF time / attnlab time) are decode.py's:
batch 1 and 8, a 16-token prompt, alternating rounds. Target: >= 1.3x at batch 1.

    python -m benchmarks models_decode [--quick]
    MODELS_DECODE_SHAPES=gemma-3-270m python -m benchmarks models_decode   # other shapes
    MODELS_DECODE_SHAPES=qwen3-moe-0.7b python -m benchmarks models_decode   # a mixture
"""

from __future__ import annotations

import os
from typing import Any

import torch

from attnlab.hf import gpt_from_hf

from .common import clock, machine, table
from .decode import PROMPT, compare

SHAPES: dict[str, tuple[str, dict[str, Any]]] = {
    "smollm-135m": ("Llama", dict(
        num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, hidden_size=576,
        intermediate_size=1536, vocab_size=49152, tie_word_embeddings=True, rms_norm_eps=1e-5,
        max_position_embeddings=2048)),
    "qwen2.5-0.5b": ("Qwen2", dict(
        num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2, hidden_size=896,
        intermediate_size=4864, vocab_size=151936, tie_word_embeddings=True, rms_norm_eps=1e-6,
        max_position_embeddings=32768,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6})),
    # Gemma 3 270M (Gemma3ForCausalLM): not in the default run, MODELS_DECODE_SHAPES picks it
    "gemma-3-270m": ("Gemma3Text", dict(
        num_hidden_layers=18, num_attention_heads=4, num_key_value_heads=1, head_dim=256,
        hidden_size=640, intermediate_size=2048, vocab_size=262144, sliding_window=512,
        query_pre_attn_scalar=256, max_position_embeddings=32768)),
    # a mixture of experts of Qwen3-MoE's make at 0.7B (32 experts 512 wide, top 4 renormalised,
    # QK-norm): not in the default run, MODELS_DECODE_SHAPES picks it
    "qwen3-moe-0.7b": ("Qwen3Moe", dict(
        num_hidden_layers=12, num_attention_heads=16, num_key_value_heads=4, head_dim=64,
        hidden_size=1024, moe_intermediate_size=512, num_experts=32, num_experts_per_tok=4,
        norm_topk_prob=True, vocab_size=32000, tie_word_embeddings=True, rms_norm_eps=1e-6,
        max_position_embeddings=4096)),
    # gpt-oss's make at 0.7B (attention sinks, windows of 128 on every other layer, 32 clamped
    # experts 512 wide with biases, top 4): not in the default run, MODELS_DECODE_SHAPES picks
    # it; transformers runs its eager attention (it has no SDPA for sinks)
    "gpt-oss-0.7b": ("GptOss", dict(
        num_hidden_layers=12, num_attention_heads=16, num_key_value_heads=4, head_dim=64,
        hidden_size=1024, intermediate_size=512, num_local_experts=32, num_experts_per_tok=4,
        vocab_size=32000, sliding_window=128, max_position_embeddings=4096,
        rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0,
                         "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                         "original_max_position_embeddings": 4096})),
    "llama-toy": ("Llama", dict(  # --quick
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, hidden_size=32,
        intermediate_size=48, vocab_size=97, tie_word_embeddings=True,
        max_position_embeddings=256)),
}
TARGET = 1.3  # HF time / attnlab time at batch 1


def build_pair(shape: str, seed: int = 0) -> tuple[Any, Any]:
    """(transformers model, attnlab GPT) with the same random weights, eval mode."""
    import transformers

    prefix, fields = SHAPES[shape]
    torch.manual_seed(seed)
    config = getattr(transformers, f"{prefix}Config")(
        **fields,
        # wider than 0.02 so logits are peaked: greedy ids then do not hinge on rounding
        initializer_range=0.1, bos_token_id=None, eos_token_id=None, pad_token_id=0,
    )
    model_class = "Gemma3ForCausalLM" if prefix == "Gemma3Text" else f"{prefix}ForCausalLM"
    hf = getattr(transformers, model_class)(config).eval()
    return hf, gpt_from_hf(config.to_dict(), hf.state_dict())


def run(quick: bool = False) -> dict[str, Any]:
    """Measure both shapes; quick: the toy Llama, 16 new tokens, one round (a smoke test)."""
    shapes, new_tokens, rounds = (["llama-toy"], 16, 1) if quick else (
        ["smollm-135m", "qwen2.5-0.5b"], 32, 3)
    if os.environ.get("MODELS_DECODE_SHAPES"):  # e.g. gemma-3-270m: other shapes of SHAPES
        shapes = os.environ["MODELS_DECODE_SHAPES"].split(",")
    records = []
    for shape in shapes:
        pair = build_pair(shape)
        records += compare(shape, (1, 8), new_tokens, rounds, pair=pair)
        del pair
    rows = [[r["shape"], SHAPES[r["shape"]][0], r["batch"], r["tokens_per_s"]["attnlab"],
             r["tokens_per_s"]["huggingface"], r["ratio"],
             "yes" if r["same_greedy_ids"] else f"{r['greedy_agreement']:.0%} of tokens"]
            for r in records]
    met = {r["shape"]: r["ratio"] >= TARGET for r in records if r["batch"] == 1}
    notes = [
        f"float32, greedy, {PROMPT}-token prompt, {new_tokens} new tokens, "
        f"{torch.get_num_threads()} torch thread(s); median {clock()} time of {rounds} "
        "alternating round(s) on a shared CPU: compare the ratio, measured side by side. "
        "Hugging Face runs its default attention (SDPA).",
        *(f"target {TARGET}x Hugging Face on {s} at batch 1: {'met' if ok else 'missed'}"
          for s, ok in met.items()),
    ]
    return {
        "suite": "models_decode",
        "machine": machine(),
        "records": records,
        "targets_met": met if not quick else {},
        "tables": [table(
            "Decode on modern-family shapes: attnlab vs Hugging Face generate (random weights)",
            ["shape", "transformers class", "batch", "attnlab tok/s", "HF tok/s",
             "HF time / attnlab time", "same greedy ids"],
            rows,
        )],
        "notes": notes,
    }
