"""The library on a CUDA GPU: traces, edits, patching, `show`, Hugging Face loading onto the
device, half-precision generation, NCCL, and a real out-of-memory. Each result is compared
with the CPU's on the same weights.

Marked `cuda`: skipped without a GPU (tests/conftest.py); ATTNLAB_TEST_DEVICE=cpu runs them on
the CPU as a dry run of their code.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from attnlab import GPT, GPTConfig, Trace
from attnlab.generate import generate, generate_text
from attnlab.hf import save_hf
from attnlab.interp.edits import Edits, ablate, patch
from attnlab.interp.patching import activation_patching, attribution_patching, logit_diff_metric
from attnlab.load import load_checkpoint
from attnlab.model.summaries import SUMMARY_NAMES
from attnlab.tokenizers import get_tokenizer
from attnlab.train.data import load_dataset
from attnlab.train.recipes import answer_accuracy
from helpers import free_port

pytestmark = pytest.mark.cuda

TEXT = "the cat sat on the mat. abcdefghijklmnopqrstuvwxyz"
# GPT-2 blocks; Llama-style ones with grouped-query attention, QK-norm and a window; Gemma 2's
# (scaled embeddings, (1 + w) norms, GeGLU, sandwich norms, soft caps: the CUDA summary and
# weight kernels are routed around a cap); Gemma 3's (QK-norm, a RoPE base per layer type);
# OLMo 2's and OLMo 3's (below); SmolLM3's, one layer without RoPE; Phi-3.5's longrope, its
# switch (8) inside the sequences; Phi-2's parallel blocks on one norm, a bias on the head;
# GPT-J's RoPE on adjacent pairs; GPT-Neo's unscaled scores and a window on one layer; OPT's
# ReLU MLP; StableLM's biased LayerNorms beside unbiased Linears; Granite's four scalars;
# Falcon-7B's one-norm parallel block with one key/value head
GEMMA = {"pos": "rope", "norm": "gemma_rmsnorm", "mlp": "geglu", "bias": False, "n_kv_head": 2,
         "scale_embeddings": True, "sandwich_norm": True, "sliding_window": 8,
         "window_layers": [0]}
FAMILIES = {
    "gpt2": {},
    "llama": {"pos": "rope", "norm": "rmsnorm", "mlp": "swiglu", "bias": False,
              "n_kv_head": 2, "qk_norm": True, "sliding_window": 8, "window_layers": [1]},
    "gemma2": {**GEMMA, "attn_logit_softcapping": 2.0, "final_logit_softcapping": 3.0,
               "init_std": 0.3},  # wide enough for the caps to bend scores and logits
    "gemma3": {**GEMMA, "qk_norm": True, "rope_theta": 1e6, "local_rope_theta": 1e4},
    # OLMo 2's: norms on the branches' outputs alone, QK-norm over whole q and k
    "olmo2": {"pos": "rope", "norm": "rmsnorm", "mlp": "swiglu", "bias": False, "n_kv_head": 2,
              "sandwich_norm": True, "pre_norm": False, "qk_norm": True,
              "qk_norm_whole": True},
    "olmo3": {"pos": "rope", "norm": "rmsnorm", "mlp": "swiglu", "bias": False, "n_kv_head": 2,
              "sandwich_norm": True, "pre_norm": False, "qk_norm": True,
              "qk_norm_whole": True, "sliding_window": 6, "window_layers": [0],
              "local_rope_theta": 1e4, "rope_theta": 5e5,
              "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                               "original_max_position_embeddings": 8}},
    "smollm3": {"pos": "rope", "norm": "rmsnorm", "mlp": "swiglu", "bias": False, "n_kv_head": 2,
                "nope_layers": [1], "sliding_window": 6, "window_layers": [1]},
    "phi3_longrope": {"pos": "rope", "norm": "rmsnorm", "mlp": "swiglu", "bias": False,
                      "rope_scaling": {"rope_type": "longrope", "factor": 4.0,
                                       "original_max_position_embeddings": 8,
                                       "short_factor": [1.0, 1.2, 1.5, 2.0],
                                       "long_factor": [1.5, 3.0, 6.0, 12.0]}},
    "phi": {"pos": "rope", "rotary_pct": 0.5, "parallel_residual": True, "shared_norm": True,
            "head_bias": True},
    "gptj": {"pos": "rope", "rotary_pct": 0.5, "rope_interleaved": True, "qkv_bias": False,
             "out_bias": False, "parallel_residual": True, "shared_norm": True,
             "head_bias": True},
    "gpt_neo": {"attn_scale": 1.0, "qkv_bias": False, "sliding_window": 8, "window_layers": [1]},
    "opt": {"mlp": "relu"},
    "stablelm": {"pos": "rope", "rotary_pct": 0.25, "mlp": "swiglu", "bias": False,
                 "norm_bias": True, "qkv_bias": True, "n_kv_head": 2},
    "granite": {"pos": "rope", "norm": "rmsnorm", "mlp": "swiglu", "bias": False,
                "attn_scale": 0.25, "embedding_multiplier": 6.0, "residual_multiplier": 0.5,
                "logits_scaling": 2.0},
    "falcon": {"pos": "rope", "bias": False, "norm_bias": True, "gelu": "exact", "n_kv_head": 1,
               "parallel_residual": True, "shared_norm": True},
    # a mixture of 4 experts, top 2 (Mixtral's), and top 3 as the router's probabilities
    # with QK-norm over whole q and k (OLMoE's)
    "mixtral": {"pos": "rope", "norm": "rmsnorm", "mlp": "swiglu", "bias": False, "n_kv_head": 2,
                "n_experts": 4, "experts_per_token": 2},
    "olmoe": {"pos": "rope", "norm": "rmsnorm", "mlp": "swiglu", "bias": False, "qk_norm": True,
              "qk_norm_whole": True, "n_experts": 4, "experts_per_token": 3,
              "experts_normalized": False, "expert_weights_in_float32": False},
    # GraniteMoE's: Granite's scalars, the top experts weighed by a softmax of their logits
    "granitemoe": {"pos": "rope", "norm": "rmsnorm", "mlp": "swiglu", "bias": False,
                   "embedding_multiplier": 6.0, "residual_multiplier": 0.5, "logits_scaling": 2.0,
                   "n_experts": 4, "experts_per_token": 2, "experts_from_top_logits": True,
                   "expert_weights_in_float32": False},
    # Qwen2-MoE's: a shared expert beside the routed ones, behind its sigmoid gate
    "qwen2_moe": {"pos": "rope", "norm": "rmsnorm", "mlp": "swiglu", "bias": False,
                  "qkv_bias": True, "out_bias": False, "n_experts": 4, "experts_per_token": 2,
                  "experts_normalized": False, "shared_expert_size": 24},
    # gpt-oss's: learned attention sinks (the explicit path on every device), windowed and
    # full layers, clamped SwiGLU experts with biases behind a biased router
    "gpt_oss": {"pos": "rope", "norm": "olmo_rmsnorm", "mlp": "clamped_swiglu", "bias": True,
                "n_kv_head": 2, "attn_sinks": True, "sliding_window": 6, "window_layers": [0],
                "n_experts": 4, "experts_per_token": 2, "experts_from_top_logits": True,
                "expert_weights_in_float32": False, "router_bias": True, "swiglu_limit": 1.0,
                "init_std": 0.3},
    # GLM-4's: half of each head turned on adjacent pairs, q/k/v biases, branch norms
    "glm4": {"pos": "rope", "norm": "rmsnorm", "mlp": "swiglu", "bias": False, "n_kv_head": 2,
             "rotary_pct": 0.5, "rope_interleaved": True, "qkv_bias": True, "out_bias": False,
             "sandwich_norm": True},
    # GLM-4.5's: DeepSeek-V3's sigmoid router in groups, scaled, an ungated shared expert,
    # a dense first layer
    "glm4_moe": {"pos": "rope", "norm": "rmsnorm", "mlp": "swiglu", "bias": False,
                 "n_kv_head": 2, "rotary_pct": 0.5, "qkv_bias": True, "out_bias": False,
                 "n_experts": 4, "experts_per_token": 2, "router_scoring": "sigmoid",
                 "expert_groups": 2, "expert_groups_chosen": 1, "routed_scaling": 2.5,
                 "shared_expert_size": 16, "shared_expert_gated": False, "dense_layers": 1},
    # ERNIE 4.5 MoE's: a softmax router picking by probability plus a correction bias, its
    # renormalising sum clamped, a mixture on the second layer alone
    "ernie4_5_moe": {"pos": "rope", "norm": "rmsnorm", "mlp": "swiglu", "bias": False,
                     "n_kv_head": 2, "rope_interleaved": True, "n_experts": 4,
                     "experts_per_token": 2, "router_scoring": "softmax_corrected",
                     "router_norm_min": 0.6, "expert_weights_in_float32": False,
                     "shared_expert_size": 16, "shared_expert_gated": False,
                     "mixture_layers": [1]},
    # DeepSeek-V3's: latent attention (a q latent, values narrower than q and k, 2 of each
    # head's 10 dims turned in pairs) beside GLM-4.5's routing
    "deepseek_v3": {"pos": "rope", "norm": "rmsnorm", "mlp": "swiglu", "bias": False,
                    "head_dim": 10, "kv_latent": 12, "q_latent": 9, "rope_head_dim": 2,
                    "v_head_dim": 6, "rope_interleaved": True, "n_experts": 4,
                    "experts_per_token": 2, "router_scoring": "sigmoid", "expert_groups": 2,
                    "expert_groups_chosen": 1, "routed_scaling": 2.5, "shared_expert_size": 16,
                    "shared_expert_gated": False, "dense_layers": 1},
    # DeepSeek-V2-Lite's: q straight from x, RoPE in float32, the softmax router in float32
    "deepseek_v2": {"pos": "rope", "norm": "rmsnorm", "mlp": "swiglu", "bias": False,
                    "head_dim": 10, "kv_latent": 12, "rope_head_dim": 4, "rope_interleaved": True,
                    "rope_in_float32": True, "n_experts": 4, "experts_per_token": 2,
                    "experts_normalized": False, "router_scoring": "softmax_float32",
                    "shared_expert_size": 16, "shared_expert_gated": False, "dense_layers": 1},
}


def _pair(device: torch.device, family: str, **overrides: object) -> tuple[GPT, GPT]:
    """The same random model on the CPU and on `device`."""
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=65, block_size=32, n_layer=2, n_head=4, n_embd=32,
                       **{**FAMILIES[family], **overrides})  # type: ignore[arg-type]
    cpu = GPT(config).eval()
    on_device = GPT(config).to(device).eval()
    on_device.load_state_dict(cpu.state_dict())
    return cpu, on_device


def _ids(T: int = 12, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 65, (2, T), generator=torch.Generator().manual_seed(seed))  # (2, T)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_trace_holds_the_cpu_values(family: str, cuda_device: torch.device) -> None:
    cpu, model = _pair(cuda_device, family)
    ids = _ids()
    expected = Trace().run(cpu, ids)
    got = Trace().run(model, ids.to(cuda_device))
    assert list(got) == list(expected) and len(expected) >= 25  # every name of both layers
    for layer, name in expected:
        torch.testing.assert_close(got.get(name, layer).cpu(), expected.get(name, layer),
                                   atol=1e-4, rtol=1e-4, msg=f"{name} of layer {layer}")


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_row_filter_holds_the_cpu_values(family: str, cuda_device: torch.device) -> None:
    """Trace(rows=...): the first and last rows' weights alone, every row's summaries."""
    cpu, model = _pair(cuda_device, family)
    ids, names = _ids(), ["attn_weights", *SUMMARY_NAMES]
    expected = Trace(rows=[0, -1], names=names).run(cpu, ids)
    got = Trace(rows=[0, -1], names=names).run(model, ids.to(cuda_device))
    assert list(got) == list(expected) and expected.get("attn_weights", 1).shape == (2, 4, 2, 12)
    for layer, name in expected:
        torch.testing.assert_close(got.get(name, layer).cpu(), expected.get(name, layer),
                                   atol=1e-4, rtol=1e-4, msg=f"{name} of layer {layer}")


def test_edits_change_the_logits_as_on_the_cpu(cuda_device: torch.device) -> None:
    cpu, model = _pair(cuda_device, "gpt2")
    clean, corrupt = _ids(seed=2), _ids(seed=3)
    for edits_of in (
        lambda m, ids: ablate([(0, 1), (1, 3)]),
        lambda m, ids: Edits([patch(Trace().run(m, ids), "resid_pre", 1, positions=[4])]),
    ):
        device_ids = corrupt.to(cuda_device)
        with torch.no_grad():
            got = model(device_ids, edits=edits_of(model, clean.to(cuda_device))).logits
            expected = cpu(corrupt, edits=edits_of(cpu, clean)).logits
        torch.testing.assert_close(got.cpu(), expected, atol=1e-4, rtol=1e-4)


def test_patching_finds_the_cpu_effects(cuda_device: torch.device) -> None:
    cpu, model = _pair(cuda_device, "llama")
    clean, corrupt = _ids(T=8, seed=4)[:1], _ids(T=8, seed=5)[:1]
    metric = logit_diff_metric(7, 9)
    for method in (activation_patching, attribution_patching):
        got, expected = method(model, clean, corrupt, metric), method(cpu, clean, corrupt, metric)
        assert got.clean == pytest.approx(expected.clean, abs=1e-4)
        torch.testing.assert_close(got.heads, expected.heads, atol=1e-3, rtol=1e-3)
        torch.testing.assert_close(got.resid, expected.resid, atol=1e-3, rtol=1e-3)


def test_show_draws_a_device_trace(tmp_path: Path, cuda_device: torch.device) -> None:
    from attnlab.viewer.notebook import show

    tok = get_tokenizer("char", TEXT)
    cpu, model = _pair(cuda_device, "gpt2")
    ids = tok.encode("the cat sat")
    trace = Trace().run(model, torch.tensor([ids], device=cuda_device))
    view = show(trace, tok, ids=ids, view="steps")  # the raw scores too, from the device
    from_model = show(model, tok, "the cat sat")
    labels = '{"tokens":["t","h","e"," ","c","a","t"," ","s","a","t"],"T":11,"S":11,'
    for html in (view.html, from_model.html, show(cpu, tok, "the cat sat").html):
        assert html.count(labels) == 1  # every token labelled, as on the CPU
    page = view.save(tmp_path / "view.html").read_text()
    assert page.startswith("<!doctype html>") and view.nbytes > 1000


def test_load_hf_onto_the_device_in_bfloat16(tmp_path: Path, cuda_device: torch.device) -> None:
    from attnlab import load_hf

    # a Llama checkpoint (QK-norm and windows are Qwen3's and Mistral's)
    cpu, _ = _pair(cuda_device, "llama", qk_norm=False, sliding_window=None, window_layers=None)
    save_hf(tmp_path / "hf", cpu, family="llama")
    loaded = load_hf(tmp_path / "hf", map_location=cuda_device, dtype=torch.bfloat16)
    assert {p.device.type for p in loaded.parameters()} == {cuda_device.type}
    assert {p.dtype for p in loaded.parameters()} == {torch.bfloat16}
    ids = _ids()
    with torch.no_grad():
        got = loaded(ids.to(cuda_device)).logits.float().cpu()
        torch.testing.assert_close(got, cpu(ids).logits, atol=0.1, rtol=0.05)


@pytest.mark.parametrize("family", ["phi3_longrope", "olmo3"])
def test_the_graphed_decode_crosses_the_longrope_switch_as_the_eager_one(
        family: str, cuda_device: torch.device) -> None:
    """generate(compile=True) on the device: the CUDA graph replays longrope's choice of
    frequency set (a tensor condition) and the static cache is filled again where a
    left-padded batch crosses the switch (8); OLMo 3's scaled full and unscaled windowed
    layers beside it. Greedy ids equal the eager decode's on the same device."""
    _, model = _pair(cuda_device, family, init_std=0.3)  # wide: no near-tied argmax
    ids = _ids(T=6).to(cuda_device)
    mask = torch.ones_like(ids)
    mask[0, :2] = 0  # row 0 left-padded by two
    eager = generate(model, ids, mask, max_new_tokens=14, temperature=0)
    graphed = generate(model, ids, mask, max_new_tokens=14, temperature=0, compile=True)
    assert torch.equal(graphed, eager)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_generation_keeps_the_answers(
    dtype: torch.dtype, cuda_copy_run: tuple[Path, str], cuda_device: torch.device
) -> None:
    """The copy model in bfloat16 and float16 on the device: the held-out answers and a
    left-padded batch's greedy tokens are float32's."""
    dataset = load_dataset("copy")
    ckpt = cuda_copy_run[0] / "ckpt"
    full = load_checkpoint(ckpt, map_location=cuda_device).model
    half = load_checkpoint(ckpt, map_location=cuda_device, dtype=dtype).model
    assert half.wte.weight.dtype == dtype
    assert answer_accuracy(half, dataset, n=256)[0] == answer_accuracy(full, dataset, n=256)[0]
    tok = dataset.tokenizer
    prompts = ["qwertyui|qwe", "asdfghjk|as"]  # two lengths: left-padded
    assert generate_text(half, tok, prompts, max_new_tokens=5, temperature=0) == \
        generate_text(full, tok, prompts, max_new_tokens=5, temperature=0) == [
            "rtyui", "dfghj"]
    ids = torch.tensor([tok.encode("zxcvbnml|")])  # host ids: generate moves them
    assert generate(half, ids, max_new_tokens=4, temperature=0).device.type == cuda_device.type


@contextlib.contextmanager
def _sync_debug(mode: str) -> Iterator[None]:
    """CUDA's sync debug mode set to `mode` inside, and back to "default" however the block
    ends. Setting it warns that the mode is a prototype; with warnings as errors that warning
    raised after the mode was set, leaving it on for the worker's later tests."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Synchronization debug mode is a prototype")
        try:
            torch.cuda.set_sync_debug_mode(mode)
            yield
        finally:
            torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("cuda_graph", [False, True])
def test_a_training_step_never_waits_for_the_gpu(
    tmp_path: Path, cuda_device: torch.device, monkeypatch: pytest.MonkeyPatch, cuda_graph: bool
) -> None:
    """CUDA's sync debug mode set to "error" around each step's micro-batches, forward,
    backward, clipping and AdamW (and the step graph's body, eager and while recorded): any
    wait for the GPU there raises. The loop waits only where it reads its losses (every 20
    steps), evaluates and saves (tests/test_fake_device.py holds that on the CPU)."""
    if cuda_device.type != "cuda":
        pytest.skip("the sync debug mode is CUDA's")
    from attnlab.train import loop
    from attnlab.train.loop import TrainConfig, train
    from attnlab.train.recipes import recipe

    def strict(method: Any) -> Any:
        def wrapped(self: Any, *args: Any) -> Any:
            with _sync_debug("error"):
                return method(self, *args)
        return wrapped

    for name in ("_accumulate_grads", "_graph_body", "_update"):
        monkeypatch.setattr(loop._Run, name, strict(getattr(loop._Run, name)))
    dataset = load_dataset("copy")
    model_config, config = recipe(dataset)
    config = TrainConfig(**{**config.__dict__, "max_iters": 30, "eval_interval": 30,
                            "eval_iters": 2, "grad_accum": 2, "dtype": "bfloat16",
                            "cuda_graph": cuda_graph, "device": str(cuda_device)})
    result = train(model_config, config, dataset, tmp_path)
    assert result.val_loss is not None and math.isfinite(result.val_loss)


def test_nccl_averages_gradients_as_one_process(cuda_device: torch.device) -> None:
    """The process group attnlab's DDP path starts on CUDA (NCCL; gloo in the CPU dry run),
    here with one process: DistributedDataParallel's gradients equal the model's own."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    port = free_port()
    backend = "nccl" if cuda_device.type == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0,
                            world_size=1)
    try:
        cpu, model = _pair(cuda_device, "gpt2")
        ids = _ids().to(cuda_device)
        ddp = DistributedDataParallel(model, device_ids=[0] if backend == "nccl" else None)
        ddp(ids, ids).loss.backward()
        reduced = torch.tensor([3.0], device=cuda_device)
        dist.all_reduce(reduced)
        assert float(reduced) == 3.0
        cpu(ids.cpu(), ids.cpu()).loss.backward()
        for (name, p), q in zip(model.named_parameters(), cpu.parameters(), strict=True):
            torch.testing.assert_close(p.grad.cpu(), q.grad, atol=1e-4, rtol=1e-3, msg=name)
    finally:
        dist.destroy_process_group()


def test_a_real_out_of_memory_is_the_error_the_commands_catch(
    cuda_copy_run: tuple[Path, str], tmp_path: Path, cuda_device: torch.device,
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    if cuda_device.type != "cuda":
        pytest.skip("the CPU allocator raises a plain RuntimeError; tests/cli/test_cli_oom.py "
                    "injects CUDA's error on the CPU")
    from attnlab.cli import main

    total = torch.cuda.get_device_properties(cuda_device).total_memory
    with pytest.raises(torch.OutOfMemoryError):
        torch.empty(2 * total, dtype=torch.uint8, device=cuda_device)

    def huge(*args: object, **kwargs: object) -> None:  # a trace too large for the card
        torch.empty(2 * total, dtype=torch.uint8, device=cuda_device)

    monkeypatch.setattr(Trace, "run", huge)
    assert main(["inspect", str(cuda_copy_run[0] / "ckpt"), "abc|", "--out",
                 str(tmp_path / "i"), "--device", str(cuda_device)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("attnlab inspect: error: out of memory on cuda:0 (CUDA out of memory. "
                          "Tried to allocate ") and err.count("\n") == 1, err
    assert "try fewer traced layers or heads (--layer, --head)" in err
    assert torch.empty(1 << 20, device=cuda_device).numel() == 1 << 20  # the device recovered


@torch.no_grad()
def test_packed_experts_dequantize_and_run_as_on_the_cpu(cuda_device: torch.device) -> None:
    """gpt-oss's MXFP4 experts kept packed (`Mxfp4Linear`) on the device: every (scale, byte)
    dequantized to the CPU's values bit for bit, and a packed mixture's logits and greedy
    ids the CPU's."""
    import copy

    from attnlab.model.mxfp4 import NAN_SCALE, pack_experts, unpack
    from attnlab.model.packed import packed_layers

    scales = torch.arange(NAN_SCALE - 2, dtype=torch.uint8).repeat_interleave(16)[:, None]
    blocks = torch.arange(256, dtype=torch.uint8).repeat(scales.numel() // 16)
    blocks = blocks.view(-1, 1, 16)  # every byte under every scale that cannot overflow
    for dtype in (torch.float32, torch.bfloat16):
        on_device = unpack(blocks.to(cuda_device), scales.to(cuda_device), dtype).cpu()
        assert torch.equal(on_device, unpack(blocks, scales, dtype))
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=65, block_size=32, n_layer=2, n_head=4, n_embd=64,
                       **{**FAMILIES["gpt_oss"], "d_ff": 32})  # type: ignore[arg-type]
    cpu = pack_experts(GPT(config)).eval()
    g = torch.Generator().manual_seed(1)
    for layer in packed_layers(cpu):
        layer.blocks.copy_(torch.randint(0, 256, layer.blocks.shape, generator=g))
        layer.scales.copy_(torch.randint(120, 126, layer.scales.shape, generator=g))
    device = copy.deepcopy(cpu).to(cuda_device)
    ids = _ids()
    torch.testing.assert_close(device(ids.to(cuda_device)).logits.cpu(), cpu(ids).logits,
                               atol=1e-4, rtol=1e-4)
    assert torch.equal(generate(device, ids[:1, :6].to(cuda_device), max_new_tokens=8,
                                temperature=0).cpu(),
                       generate(cpu, ids[:1, :6], max_new_tokens=8, temperature=0))
