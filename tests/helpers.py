"""Helpers shared by several test files (tests/ is on sys.path under pytest)."""

from __future__ import annotations

import importlib
import json
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch

import attnlab.model.decode as decode
import attnlab.model.decode_parts as decode_parts
from attnlab.model.gpt import GPT, GPTConfig, laid_out
from attnlab.tokenizers import Tokenizer, get_tokenizer


def left_padded(
    lengths: list[int], *, vocab: int = 65, low: int = 0, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random ids in [low, vocab) left-padded with 0 to the longest length, and their mask."""
    g = torch.Generator().manual_seed(seed)
    P = max(lengths)
    ids = torch.randint(low, vocab, (len(lengths), P), generator=g)  # (B, P)
    mask = torch.zeros(len(lengths), P, dtype=torch.long)  # (B, P)
    for b, n in enumerate(lengths):
        mask[b, P - n:] = 1
        ids[b, : P - n] = 0
    return ids, mask


def assert_fixed_steps_match(model: GPT, fixed: Any, ids: torch.Tensor,
                             mask: torch.Tensor | None, steps: int = 6) -> Any:
    """Prefill `ids` into `fixed.cache` (a `CompiledDecode`) and a KV cache of its own, then
    decode `steps` greedy tokens: `fixed`'s logits equal `DecodeStep`'s at every step within
    float32 rounding (it attends over its whole masked buffer). mask: None when no row is
    padded. Returns the eager cache."""
    B, P = ids.shape
    cache = model.new_cache(B, P + steps)
    step = decode.decode_step(model)
    with torch.inference_mode():
        logits = model(ids, attention_mask=mask, kv_cache=cache).logits[:, -1]  # (B, V)
        model(ids, attention_mask=mask, kv_cache=fixed.cache)
        fixed.start(mask)
        keep = torch.ones_like(ids, dtype=torch.bool) if mask is None else mask.bool()  # (B, P)
        seq = ids
        for _ in range(steps):
            token = logits.argmax(-1, keepdim=True)  # (B, 1)
            keep = torch.cat([keep, torch.ones_like(token, dtype=torch.bool)], dim=1)
            seq = torch.cat([seq, token], dim=1)  # (B, P + t)
            logits = step(token, None if mask is None else keep, cache)  # (B, V)
            # float32 rounding grows with the values summed, not with the logits: a model
            # without norms reaches hidden states in the thousands whose head product
            # cancels to logits of a few (or a soft cap squeezes them there)
            atol = 1e-5 * max(1.0, float(logits.abs().max()), _head_terms(model, seq, keep))
            torch.testing.assert_close(fixed(step, token), logits, atol=atol, rtol=1e-5)
    return cache


def _head_terms(model: GPT, seq: torch.Tensor, keep: torch.Tensor) -> float:
    """The largest sum of |h_i| |W_ji| over the head's products at `seq`'s last position: the
    magnitude its float32 sums round at."""
    from attnlab import Trace

    trace = Trace(names=["block_out"], layers=[model.config.n_layer - 1])
    model(seq, attention_mask=keep.long(), trace=trace)
    h = model.ln_f(trace.get("block_out", model.config.n_layer - 1)[:, -1])  # (B, C)
    return float((h.abs() @ model.lm_head.weight.abs().T).max())


def seeded_model(preset: str = "nano", **overrides: object) -> GPT:
    """The `preset` model with `overrides`, initialized after torch.manual_seed(0), in eval
    mode."""
    torch.manual_seed(0)
    return GPT(GPTConfig.from_name(preset, **overrides)).eval()


def random_ids(B: int, T: int, seed: int = 1) -> torch.Tensor:
    """(B, T) ids drawn uniformly from [0, 65) (nano's vocabulary) by a generator seeded
    `seed`."""
    return torch.randint(0, 65, (B, T), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def assert_logits_match_hf(ours: Any, hf: Any, lengths: list[int], *, low: int = 1) -> None:
    """Logits equal a transformers model's within 1e-4 (float32): one row of 20 ids in
    [low, V), then a batch left-padded to `lengths` (HF given the real positions, as its
    generate does), compared at the real tokens."""
    V = ours.config.vocab_size
    ids = torch.randint(low, V, (1, 20), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(ours(ids).logits, hf(ids).logits, atol=1e-4, rtol=0)

    ids, mask = left_padded(lengths, vocab=V, low=1, seed=1)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # (B, P): the real positions
    expected = hf(ids, attention_mask=mask, position_ids=positions).logits
    got = ours(ids, attention_mask=mask).logits
    real = mask.bool()  # pad positions' logits mean nothing; compare the real tokens
    torch.testing.assert_close(got[real], expected[real], atol=1e-4, rtol=0)
    # two implementations, not one model compared with itself (their logits may still be
    # bit-equal: Gemma 2's capped scores take the same explicit steps on both sides)
    assert type(ours).__module__.startswith("attnlab") and type(hf).__module__.startswith(
        "transformers")


def assert_ngrams_and_typical_p_match_hf(ours: Any, hf: Any) -> None:
    """generate(no_repeat_ngram_size=..., typical_p=...) against transformers' generate():
    greedy ids equal for a left-padded batch and a row alone, sampled ids too with every
    processor on and torch's RNG seeded alike. The padding holds id 0, which neither side
    may generate (attnlab's unused_ids, transformers' suppress_tokens: both -inf before
    sampling, and -inf passes the penalty and the ban unchanged), so transformers' processor,
    which reads a padded row's padding as ids, bans what attnlab's bans the row alone."""
    from attnlab.generate import generate

    ids, mask = left_padded([4, 12, 9], vocab=ours.config.vocab_size, low=1, seed=2)
    N = 24  # within the smallest position table (40) after the 12-token prompt
    kwargs = dict(max_new_tokens=N, min_new_tokens=N, eos_token_id=None, pad_token_id=0,
                  suppress_tokens=[0])
    plain = generate(ours, ids, mask, max_new_tokens=N, temperature=0, unused_ids=[0])
    for size in (1, 2, 3):
        for rows in (slice(None), slice(1, 2)):
            expected = hf.generate(ids[rows], attention_mask=mask[rows], do_sample=False,
                                   no_repeat_ngram_size=size, **kwargs)
            got = generate(ours, ids[rows], mask[rows], max_new_tokens=N, temperature=0,
                           no_repeat_ngram_size=size, unused_ids=[0])
            assert torch.equal(got, expected), (size, rows)
        if size == 1:
            assert not torch.equal(got, plain[1:2])  # the ban changed the greedy ids
    how = dict(temperature=0.9, top_k=30, top_p=0.95, min_p=0.02, typical_p=0.7,
               repetition_penalty=1.2, no_repeat_ngram_size=2)
    for seed in (5, 6):
        torch.manual_seed(seed)
        expected = hf.generate(ids, attention_mask=mask, do_sample=True, **how, **kwargs)
        torch.manual_seed(seed)  # generator=None: both draw from torch's global generator
        got = generate(ours, ids, mask, max_new_tokens=N, unused_ids=[0], **how)
        assert torch.equal(got, expected), seed


def assert_dropped(dropped: torch.Tensor, whole: torch.Tensor, p: float) -> None:
    """`dropped` is `whole` through dropout p: each element zeroed or scaled by 1 / (1 - p),
    and of the nonzero ones in `whole` a share p zeroed (within 0.1: the tests' seeded draws of
    a thousand elements and more land well inside it)."""
    kept = dropped != 0
    torch.testing.assert_close(dropped[kept], whole[kept] / (1 - p))
    zeroed = (~kept)[whole != 0].float().mean().item()
    assert abs(zeroed - p) < 0.1, f"dropout {p} zeroed {zeroed:.3f} of the elements"


def one_head_model() -> Any:
    """Two attention-only layers of two heads; every q/k weight is 0, so attention is uniform
    over the causal keys. Token t embeds as e_t (dims 0-3). Only head 0 of layer 1 has values:
    it copies the tokens' one-hot vectors and its output projection writes them to dims 4-7,
    the only dims the unembedding reads. So that head alone carries the answer."""
    from attnlab import GPT, GPTConfig
    config = GPTConfig(vocab_size=4, block_size=8, n_layer=2, n_head=2, n_embd=8, bias=False,
                       mlp="none", norm="none", tie_weights=False, init_std=None)
    model = GPT(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        attn = model.blocks[1].attn
        for t in range(4):
            model.wte.weight[t, t] = 1.0
            attn.value.weight[t, t] = 1.0  # head 0's value dims 0-3 = the token's one-hot
            attn.out_proj.weight[4 + t, t] = 1.0  # head 0's context -> residual dims 4-7
            model.lm_head.weight[t, 4 + t] = 1.0
    return model


def tokenizer_with_holes() -> Any:
    """A tokenizer.json-style HFTokenizer whose ids have holes: <unk>, <s>, </s> at 0-2 and
    the characters a, b, c at their code points 97-99 (ids 0..99, six of them tokens)."""
    import pytest

    tk = pytest.importorskip("tokenizers")
    from attnlab.tokenizers import HFTokenizer

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{chr(i): i for i in range(97, 100)}}
    backend = tk.Tokenizer(tk.models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = tk.pre_tokenizers.Split("", "isolated")
    backend.decoder = tk.decoders.Fuse()
    return HFTokenizer(backend, name="hf:tokenizer.json")


def linears_laid_out(model: torch.nn.Module) -> bool:
    """Whether `model` has Linear layers and each weight has the memory GPT gives it, its
    longer side along rows (`GPT.lay_out_weights`)."""
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    return bool(linears) and all(laid_out(m) for m in linears)


def make_row_major(model: torch.nn.Module) -> None:
    """Every parameter in plain row-major memory, as nn.Linear allocates it: the layout GPT's
    replaced, which checkpoints saved before it hold and `DecodeStep` must still take."""
    for p in model.parameters():
        p.data = p.data.contiguous()


#: the characters the viewer tests' char tokenizer knows
CORPUS = "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ.,;:!?'\n0123456789"


def byte_fallback_bpe() -> Any:
    """Llama 2's / Mistral's shape: words with their "▁", every byte as a <0xNN> token for
    the text the words do not cover."""
    tk = pytest.importorskip("tokenizers")
    vocab = {"<unk>": 0, **{f"<0x{b:02X}>": 1 + b for b in range(256)}, "▁": 257, "a": 258,
             "▁a": 259}
    backend = tk.Tokenizer(tk.models.BPE(vocab, [("▁", "a")], unk_token="<unk>",
                                         byte_fallback=True))
    backend.pre_tokenizer = tk.pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    backend.decoder = tk.decoders.Sequence([tk.decoders.Replace("▁", " "),
                                            tk.decoders.ByteFallback(), tk.decoders.Fuse(),
                                            tk.decoders.Strip(" ", 1, 0)])
    from attnlab.tokenizers import HFTokenizer

    return HFTokenizer(backend, name="hf:tokenizer.json")


def make_tokenizer() -> Tokenizer:
    """The char tokenizer of CORPUS."""
    return get_tokenizer("char", CORPUS)


def make_model(vocab_size: int, **overrides: Any) -> GPT:
    """nano over `vocab_size` ids with `overrides` (`seeded_model`)."""
    return seeded_model("nano", vocab_size=vocab_size, **overrides)


def nano_checkpoint(directory: Path, alphabet: str, **overrides: Any) -> Path:
    """A seeded, untrained nano model (block_size 32, `overrides` to its config) over the
    characters of `alphabet`, saved as an attnlab checkpoint in directory/ckpt: what the CLI
    tests run commands on."""
    from attnlab.checkpoint import save_checkpoint
    from attnlab.tokenizers import CharTokenizer

    tok = CharTokenizer(sorted(set(alphabet)))
    torch.manual_seed(0)
    model = GPT(GPTConfig.from_name("nano", vocab_size=tok.vocab_size, block_size=32,
                                    **overrides))
    return save_checkpoint(directory / "ckpt", model, tok)


def free_port() -> int:
    """A loopback port no one listens on (the OS's pick, released at once)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def first_answer(proc: subprocess.Popen[str], url: str, seconds: float) -> Any:
    """The first `httpx.Response` of GET url from the server `proc` is starting, asked every
    0.2 s; fails (with its output) if the process exits, or once `seconds` have passed."""
    import httpx

    deadline = time.monotonic() + seconds
    while True:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"attnlab serve did not answer within {seconds:g} s"
        try:
            return httpx.get(url, timeout=2)
        except httpx.TransportError:
            time.sleep(0.2)


@contextmanager
def serving(app: Any, **config: Any) -> Iterator[int]:
    """uvicorn serving `app` on a free loopback port, in a thread; yields the port."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, **config))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start within 20 s"
        time.sleep(0.05)
    try:
        yield port
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def modern_switches(n_layer: int = 2, latent: bool = False) -> Any:
    """Hypothesis strategy: GPTConfig overrides over the modern-family switches (RoPE with
    partial rotary and scaling, RMSNorm, SwiGLU, head_dim, QK-norm, attention biases,
    parallel residual, sliding windows, Gemma's (1 + w) norm, GeGLU, scaled embeddings and
    sandwich norms, Gemma 3's RoPE base of its windowed layers, Gemma 2's soft caps of scores
    and logits, OLMo 2's blocks without pre-norms and its QK-norm over whole q and k, Phi's
    one norm for a parallel block and bias on the head, a mixture of 3 experts (or 4 behind
    DeepSeek-V3's sigmoid router in groups, or ERNIE 4.5's softmax one with a correction
    bias and a clamp; a scaling, an ungated shared expert, a dense first layer or a mixture
    on the last layer alone), gpt-oss's attention sinks and clamped SwiGLU, Llama 4's L2
    QK-norm, NoPE layers' temperature and input-scaling router, nanochat's unscaled norms,
    embedding norm and backward RoPE, OLMo 1's unscaled LayerNorm and q/k/v clamp, MiniCPM3's
    head input scaled, Hunyuan's QK-norm after RoPE), valid for a
    model with 4 query heads (head size 4 or 8). The property tests of model, attention,
    cache, trace and generation draw from it so every invariant runs over every switch.
    `latent`: DeepSeek's latent attention too, for tests with one k and v per query head and
    no decode step (it refuses latent attention)."""
    from hypothesis import strategies as st

    scalings = [
        None,
        {"rope_type": "linear", "factor": 2.0},
        {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
         "original_max_position_embeddings": 8},
        # an attention factor of 1.14 on cos and sin: every path must apply it
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8},
    ]

    @st.composite
    def draw(draw: Any) -> dict[str, Any]:
        pos = draw(st.sampled_from(["learned", "rope", "none"]))
        switches: dict[str, Any] = {
            "pos": pos,
            "norm": draw(st.sampled_from(["layernorm", "rmsnorm", "gemma_rmsnorm", "olmo_rmsnorm",
                                          "unit_rmsnorm", "unit_layernorm", "none"])),
            "qkv_clip": draw(st.sampled_from([None, 0.5])),  # OLMo 1's clamp
            "embedding_norm": draw(st.booleans()),  # nanochat's
            "mlp": draw(st.sampled_from(["gelu", "relu", "relu2", "swiglu", "geglu",
                                         "clamped_swiglu", "none"])),
            "scale_embeddings": draw(st.booleans()),
            "head_dim": draw(st.sampled_from([None, 8])),
            "d_ff": draw(st.sampled_from([None, 24])),
            "qk_norm": draw(st.booleans()),
            "pre_norm": draw(st.booleans()),
            "qkv_bias": draw(st.sampled_from([None, True, False])),
            "out_bias": draw(st.sampled_from([None, True, False])),
            "parallel_residual": draw(st.booleans()),
            "norm_eps": draw(st.sampled_from([1e-5, 1e-6])),
            # 0.5 saturates most scores of an init_std=0.3 model; 5.0 bends few of its logits
            "attn_logit_softcapping": draw(st.sampled_from([None, 0.5, 5.0])),
            "final_logit_softcapping": draw(st.sampled_from([None, 5.0])),
            "head_bias": draw(st.booleans()),
            "norm_bias": draw(st.sampled_from([None, True, False])),
            "scores_in_float32": draw(st.booleans()),
            "attn_sinks": draw(st.booleans()),  # gpt-oss's, drawn at init_std as other weights
            # Granite's scalars
            "embedding_multiplier": draw(st.sampled_from([1.0, 3.0])),
            "residual_multiplier": draw(st.sampled_from([1.0, 0.5])),
            "logits_scaling": draw(st.sampled_from([1.0, 2.0])),
            "logits_scaled_first": draw(st.booleans()),  # MiniCPM3's: before the head
            "logit_scale": draw(st.sampled_from([1.0, 0.25])),  # Cohere's
        }
        if pos == "rope":
            switches["rotary_pct"] = draw(st.sampled_from([1.0, 0.5]))
            switches["rope_theta"] = draw(st.sampled_from([10000.0, 500.0]))
            switches["rope_scaling"] = draw(st.sampled_from(scalings))
            switches["nope_layers"] = draw(st.sampled_from([None, [0], [n_layer - 1]]))
            # Llama 4's: the L2 QK-norm after RoPE, the NoPE layers' temperature (a floor of
            # 1 or 3 positions, so that it grows within a test's few tokens)
            switches["qk_l2_norm"] = not switches["qk_norm"] and draw(st.booleans())
            switches["rope_backwards"] = draw(st.booleans())  # nanochat's turn
            if switches["nope_layers"] is not None and draw(st.booleans()):
                switches.update(nope_temperature=0.5,
                                nope_temperature_floor=draw(st.sampled_from([1, 3])))
        # sandwich norms need the sequential residual; the whole-width QK-norm, QK-norm
        switches["sandwich_norm"] = not switches["parallel_residual"] and draw(st.booleans())
        switches["shared_norm"] = switches["parallel_residual"] and draw(st.booleans())
        switches["qk_norm_whole"] = switches["qk_norm"] and draw(st.booleans())
        switches["qk_norm_heads"] = draw(st.sampled_from([None, "cohere", "stablelm"])) if (
            switches["qk_norm"] and not switches["qk_norm_whole"]) else None  # a row per head
        switches["qk_norm_after_rope"] = pos == "rope" and switches["qk_norm"] and not (
            switches["qk_norm_whole"]) and draw(st.booleans())  # Hunyuan's order
        switches["rope_in_float32"] = pos == "rope" and draw(st.booleans())
        switches["rope_tables_rounded"] = switches["rope_in_float32"] and draw(st.booleans())
        switches["rope_interleaved"] = pos == "rope" and draw(st.booleans())
        if switches["mlp"] != "none" and draw(st.booleans()):  # a mixture of 3 experts
            normalized = draw(st.booleans())
            switches.update(n_experts=3, experts_per_token=draw(st.sampled_from([1, 2])),
                            experts_normalized=normalized,
                            experts_from_top_logits=normalized and draw(st.booleans()),
                            expert_weights_in_float32=draw(st.booleans()),
                            shared_expert_size=draw(st.sampled_from([None, 12])),
                            router_bias=draw(st.booleans()),
                            routed_scaling=draw(st.sampled_from([1.0, 2.5])),
                            shared_expert_gated=draw(st.booleans()),
                            dense_layers=draw(st.sampled_from([0, 1] if n_layer > 1 else [0])),
                            dense_d_ff=draw(st.sampled_from([None, 20])))
            if draw(st.booleans()):  # DeepSeek-V3's sigmoid router, 4 experts in 1 or 2 groups
                groups = draw(st.sampled_from([1, 2]))
                switches.update(n_experts=4, router_scoring="sigmoid", expert_groups=groups,
                                expert_groups_chosen=draw(st.sampled_from([1, groups])),
                                experts_from_top_logits=False, router_bias=False,
                                experts_per_token=draw(st.sampled_from([1, 3])))
            elif draw(st.booleans()):  # ERNIE 4.5's softmax router with a correction bias
                switches.update(router_scoring="softmax_corrected", experts_normalized=True,
                                experts_from_top_logits=False, router_bias=False,
                                router_norm_min=draw(st.sampled_from([0.0, 0.9])))
            elif draw(st.booleans()):  # Llama 4's: the chosen experts' inputs scaled
                switches.update(router_scoring="sigmoid_input", experts_normalized=False,
                                experts_from_top_logits=False, router_bias=False)
            if n_layer > 1 and draw(st.booleans()):  # a mixture on the last layer alone
                switches.update(dense_layers=0, mixture_layers=[n_layer - 1])
        if latent and draw(st.booleans()):  # k and v from a latent, 2 dims turned by RoPE
            switches.update(kv_latent=6, q_latent=draw(st.sampled_from([None, 5])), n_kv_head=None,
                            rope_head_dim=2, v_head_dim=draw(st.sampled_from([None, 3])),
                            qk_norm=False, qk_norm_whole=False, qk_norm_heads=None,
                            attn_sinks=False, qk_l2_norm=False, nope_temperature=0.0,
                            qkv_clip=None, qk_norm_after_rope=False)
        window = draw(st.sampled_from([None, 2, 3]))
        if window is not None:
            switches["sliding_window"] = window
            switches["window_layers"] = draw(
                st.sampled_from([None, [0], list(range(1, n_layer))])
            )
            if pos == "rope":  # the windowed layers' own RoPE base (Gemma 3)
                switches["local_rope_theta"] = draw(st.sampled_from([None, 100.0]))
        return switches

    return draw()


@contextmanager
def split_blocks(threads: int, split_min: int = 1) -> Iterator[None]:
    """torch at `threads` threads, and every matrix of >= split_min weights cut into blocks."""
    before, old_min = torch.get_num_threads(), decode_parts.SPLIT_MIN
    torch.set_num_threads(threads)
    decode_parts.SPLIT_MIN = split_min
    try:
        yield
    finally:
        torch.set_num_threads(before)
        decode_parts.SPLIT_MIN = old_min


def read_metrics(run: Path) -> list[dict[str, Any]]:
    """The rows of a training run's metrics.jsonl."""
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def cli_train(tmp_path: Path, *flags: str) -> int:
    """`attnlab train --quiet --out TMP_PATH/run FLAGS`, in-process: its exit code."""
    from attnlab.cli import main

    return main(["train", "--quiet", "--out", str(tmp_path / "run"), *flags])


def _triton_or_kernels(name: str) -> bool:
    """triton's own modules (not its compiled core) and attnlab's kernel modules
    (attnlab.model.*_triton), which import one another."""
    return ((name.startswith("attnlab.model.") and name.endswith("_triton"))
            or (name.split(".")[0] == "triton" and not name.startswith("triton._C")))


@contextmanager
def interpreted(monkeypatch: pytest.MonkeyPatch, module: str) -> Iterator[Any]:
    """triton and the kernels' `module` (attnlab.model.NAME) imported afresh under Triton's
    interpreter (CPU tensors), yielded, with every other kernel module it imports then: triton
    reads TRITON_INTERPRET as it decorates, its own library included, so the modules imported
    before (by torch, or an earlier test) are set aside meanwhile."""
    import attnlab.model as package

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    for name in [name for name in sys.modules if _triton_or_kernels(name)]:
        monkeypatch.delitem(sys.modules, name)
        if name.startswith("attnlab.model."):
            monkeypatch.delattr(package, name.rsplit(".", 1)[1], raising=False)
    monkeypatch.delattr(package, module.rsplit(".", 1)[1], raising=False)
    yield importlib.import_module(module)
    for name in list(sys.modules):  # the interpreted copies; monkeypatch restores the others
        if _triton_or_kernels(name):
            del sys.modules[name]
            attribute = name.rsplit(".", 1)[-1]
            if name.startswith("attnlab.model.") and hasattr(package, attribute):
                delattr(package, attribute)


def generate_flag_runs(path: Path, model: GPT, tokenizer: Tokenizer,
                       capsys: pytest.CaptureFixture[str], new_tokens: int
                       ) -> tuple[Callable[..., str], Callable[..., str]]:
    """run(*flags): what `attnlab generate PATH "the fox"` prints with the flags, and
    expected(**how): what generate_text gives with the same settings, printed alike."""
    from attnlab.cli import main
    from attnlab.generate import generate_text

    def run(*flags: str) -> str:
        assert main(["generate", str(path), "the fox", "--max-new-tokens", str(new_tokens),
                     *flags]) == 0
        return capsys.readouterr().out

    def expected(**how: Any) -> str:
        return "the fox" + generate_text(model, tokenizer, ["the fox"],
                                         max_new_tokens=new_tokens, **how)[0] + "\n"

    return run, expected


def transformers_shapes(hf_config: dict[str, Any]) -> tuple[dict[str, tuple[int, ...]], int]:
    """(name -> shape of every tensor, parameter count) of transformers' own class for
    `hf_config` (its first architecture), built on the meta device: what a family's names and
    shapes (`benchmarks.loading.hf_shapes`) must equal. A tied head is left out, as attnlab
    writes the table once."""
    transformers = pytest.importorskip("transformers")
    cls = getattr(transformers, hf_config["architectures"][0])
    with torch.device("meta"):
        model = cls(cls.config_class(**hf_config))
    shapes = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        del shapes["lm_head.weight"]
    return shapes, model.num_parameters()


def sparse_dir_with_tokenizer(directory: Path, hf_config: dict[str, Any]) -> Path:
    """`benchmarks.loading.sparse_hf_dir` (two shards that take no disk) with a small
    tokenizer.json beside them: a directory without one is refused, and one of GPT-2's
    vocabulary size would send the reader to tiktoken's files (a download)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks.loading import sparse_hf_dir

    sparse_hf_dir(directory, hf_config, shards=2)
    tokenizer = Path(__file__).resolve().parent / "data" / "v0.2_hf_llama" / "tokenizer.json"
    (directory / "tokenizer.json").write_bytes(tokenizer.read_bytes())
    return directory


def per_expert(shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """transformers' in-memory experts (E, 2F, C) and (E, C, F) as save_pretrained writes
    them: one gate_proj, up_proj and down_proj a expert."""
    out: dict[str, tuple[int, ...]] = {}
    for name, shape in shapes.items():
        match = re.fullmatch(r"(.*\.mlp\.experts\.)(gate_up_proj|down_proj)", name)
        if match is None:
            out[name] = shape
            continue
        E, rows, cols = shape
        parts = [("gate_proj", rows // 2), ("up_proj", rows // 2)] if (
            match[2] == "gate_up_proj") else [("down_proj", rows)]
        for e in range(E):
            for part, n in parts:
                out[f"{match[1]}{e}.{part}.weight"] = (n, cols)
    return out


def latent_config(q_latent: int | None = 6, v_head_dim: int | None = 5, pairs: bool = True,
            **overrides: object) -> GPTConfig:
    """A two-layer latent-attention model's config: 3 heads of 10 dims (4 turned by RoPE),
    a 7-wide kv latent, a 6-wide q latent (None: q from x) and 5-wide values (None: 10)."""
    return GPTConfig(**{**dict(
        vocab_size=41, block_size=40, n_layer=2, n_head=3, n_embd=24, head_dim=10,
        pos="rope", norm="rmsnorm", mlp="swiglu", bias=False, tie_weights=False,
        kv_latent=7, q_latent=q_latent, rope_head_dim=4, v_head_dim=v_head_dim,
        rope_interleaved=pairs, init_std=0.3), **overrides})  # type: ignore[arg-type]
