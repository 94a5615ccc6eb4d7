"""What `attnlab train` trains when no flag says otherwise, and how a task run is scored.

`recipe(dataset, arch, device)` picks the model and schedule per kind of data (`arch`:
GPT-2-, Llama-, Gemma-3- or OLMo-2-style blocks at the same parameter count; `device`: text
on a GPU gets a GPU-sized model); `seed_experiment` is the hello-world and animals
experiments; `answer_accuracy` is the task datasets' held-out exact-match score.
The loop itself is `loop.py`'s.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import torch

from ..model.gpt import GPT, GPTConfig, count_params
from ..model.runtime import fast_bf16
from .config import TrainConfig
from .data import Dataset, SentenceDataset, TaskDataset, TextDataset, load_dataset

if TYPE_CHECKING:
    from ..interp.edits import Edit, Edits


#: `attnlab train --arch`: the block style of the recipe's model.
ARCHS = ("gpt2", "llama", "gemma3", "olmo2", "phi")
#: The text recipe's most steps when no flag sets them (one pass over a corpus of a few
#: million tokens); for longer runs, say how long: --time_budget
#: (docs/train.md#train-for-a-time-budget).
MAX_TEXT_STEPS = 5000


def recipe(dataset: Dataset, arch: str = "gpt2", device: str = "cpu",
           processes: int = 1) -> tuple[GPTConfig, TrainConfig]:
    """The model and schedule `attnlab train` uses for a dataset when no flag changes them.

    hello/animals: the one-layer experiments of `seed_experiment`. Tasks: two layers of four
    heads, enough for an induction head, trained for 600 steps. Text: nanoGPT's
    shakespeare_char CPU recipe shape (4 layers, 4 heads, 128 dims, context 64); on a CUDA
    `device` ("cuda", "cuda:1"), its GPU recipe (`gpu_text_recipe`), for `processes` processes
    (torchrun's WORLD_SIZE).
    arch "llama" keeps the shape and schedule but builds Llama-style blocks (`llama_style`),
    "gemma3" Gemma-3-style ones (`gemma3_style`), "olmo2" OLMo-2-style ones (`olmo2_style`),
    "phi" Phi-2-style ones (`phi_style`).
    """
    if arch not in ARCHS:
        raise ValueError(f"arch={arch!r} must be one of {list(ARCHS)}")
    if not isinstance(dataset, (SentenceDataset, TaskDataset, TextDataset)):
        raise TypeError(f"recipe() knows text, task and sentence datasets, not "
                        f"{type(dataset).__name__}; make one with load_dataset(name or path)")
    if isinstance(dataset, SentenceDataset):
        if arch != "gpt2":
            raise ValueError(
                f"arch={arch!r}: the {dataset.name} experiment is seed 002's minimal model; "
                "--arch applies to text files and tasks"
            )
        model, config, _ = seed_experiment(dataset.name, dataset)
        return model, config
    if isinstance(dataset, TextDataset) and device.split(":")[0] == "cuda":
        model, config = gpu_text_recipe(dataset.tokenizer.vocab_size, processes)
    else:
        model, config = _gpt2_recipe(dataset)
    styles = {"llama": llama_style, "gemma3": gemma3_style, "olmo2": olmo2_style,
              "phi": phi_style}
    return (styles[arch](model) if arch in styles else model), config


#: Llama's blocks, as `llama_style` and `olmo2_style` switch them on
LLAMA_BLOCKS: dict[str, Any] = dict(pos="rope", norm="rmsnorm", mlp="swiglu", bias=False,
                                    qkv_bias=None, out_bias=None, gelu="tanh")


def llama_style(config: GPTConfig) -> GPTConfig:
    """`config` with Llama's blocks: RoPE instead of a position table, RMSNorm, SwiGLU, no
    biases; d_ff chosen so the parameter count is the closest to `config`'s (SwiGLU has
    three d_ff x C matrices where GELU has two)."""
    return _same_count(config, dataclasses.replace(config, **LLAMA_BLOCKS))


def gemma3_style(config: GPTConfig) -> GPTConfig:
    """`config` with Gemma 3's blocks: RoPE, Gemma's (1 + w) RMSNorm before and after each
    branch (sandwich norms) and on queries and keys (QK-norm), GeGLU with the tanh GELU,
    embeddings times sqrt(n_embd), no biases; d_ff chosen as `llama_style` does. Every layer
    attends over the whole context: Gemma 3's windows (512 tokens and more, on five layers of
    six) are longer than the recipes' contexts."""
    return _same_count(config, dataclasses.replace(
        config, pos="rope", norm="gemma_rmsnorm", mlp="geglu", bias=False, qkv_bias=None,
        out_bias=None, gelu="tanh", scale_embeddings=True, sandwich_norm=True, qk_norm=True,
    ))


def olmo2_style(config: GPTConfig) -> GPTConfig:
    """`config` with OLMo 2's blocks: Llama's (RoPE, RMSNorm, SwiGLU, no biases) with no
    norm before a branch and one after each (`pre_norm=False`, `sandwich_norm`), and QK-norm
    over each token's whole q and k (`qk_norm_whole`), rounding as OLMo's (norms scaled
    before the cast back, RoPE in float32); d_ff chosen as `llama_style` does."""
    return _same_count(config, dataclasses.replace(
        config, **{**LLAMA_BLOCKS, "norm": "olmo_rmsnorm"}, pre_norm=False, sandwich_norm=True,
        qk_norm=True, qk_norm_whole=True, rope_in_float32=True,
    ))


def phi_style(config: GPTConfig) -> GPTConfig:
    """`config` with Phi-2's blocks: attention and the GELU MLP side by side on one
    LayerNorm's output (`parallel_residual`, `shared_norm`), RoPE on half of each head (Phi-2:
    0.4 of 80 dims), biases everywhere, the head's too; d_ff chosen as `llama_style` does."""
    return _same_count(config, dataclasses.replace(
        config, pos="rope", rotary_pct=0.5, parallel_residual=True, shared_norm=True,
        head_bias=True, bias=True, qkv_bias=None, out_bias=None, gelu="tanh",
    ))


def _same_count(config: GPTConfig, styled: GPTConfig) -> GPTConfig:
    """`styled` with the d_ff that brings its parameter count closest to `config`'s."""
    target = count_params(config)
    one = count_params(dataclasses.replace(styled, d_ff=1))
    per_unit = count_params(dataclasses.replace(styled, d_ff=2)) - one  # params per d_ff unit
    d_ff = max(1, round((target - one) / per_unit) + 1)
    return dataclasses.replace(styled, d_ff=d_ff)


def arch_of(config: GPTConfig) -> str:
    """The ARCHS entry whose blocks `config` has: "llama", "gemma3", "olmo2" or "phi" where
    `llama_style`, `gemma3_style`, `olmo2_style` or `phi_style` switched them."""
    if config.shared_norm:
        return "phi"
    blocks = (config.pos, config.norm, config.mlp, config.sandwich_norm, config.pre_norm)
    return {("rope", "rmsnorm", "swiglu", False, True): "llama",
            ("rope", "gemma_rmsnorm", "geglu", True, True): "gemma3",
            ("rope", "olmo_rmsnorm", "swiglu", True, False): "olmo2"}.get(blocks, "gpt2")


def _gpt2_recipe(dataset: Dataset) -> tuple[GPTConfig, TrainConfig]:
    vocab = dataset.tokenizer.vocab_size
    if isinstance(dataset, TaskDataset):
        model = GPTConfig(vocab_size=vocab, block_size=dataset.max_block_size, n_layer=2,
                          n_head=4, n_embd=64, dropout=0.0, gelu="exact")
        return model, TrainConfig(max_iters=600, batch_size=32, lr=3e-3, warmup_iters=50,
                                  eval_interval=100, eval_iters=4)
    # nanoGPT's shakespeare_char CPU shape, trained the fastest way benchmarks/ found on a CPU:
    # twice the batch at four times the lr for 700 steps, in bf16 where the hardware has it:
    # val loss 1.90 in well under half the time of nanoGPT's recipe
    # (docs/performance.md#text-recipe). 700 steps is about one pass over tiny Shakespeare; a
    # larger corpus gets one pass over its training split (docs/train.md#train-for-a-time-budget
    # for both on a second corpus), up to MAX_TEXT_STEPS.
    assert isinstance(dataset, TextDataset), type(dataset)  # recipe() refused the rest
    model = GPTConfig.from_name("tiny", vocab_size=vocab)
    batch_size = 24
    one_pass = len(dataset.train) // (batch_size * model.block_size)
    dtype = "bfloat16" if fast_bf16() else "float32"
    return model, TrainConfig(
        max_iters=min(max(700, one_pass), MAX_TEXT_STEPS), batch_size=batch_size, lr=4e-3,
        warmup_iters=50, eval_interval=100, dtype=dtype)  # min_lr: lr / 10, whatever --lr


def gpu_text_recipe(vocab_size: int, processes: int = 1) -> tuple[GPTConfig, TrainConfig]:
    """Text on a GPU: nanoGPT's GPU shakespeare_char shape and optimizer (6 layers, 6 heads,
    384 wide, context 256, batch 64, dropout 0.2, no biases, exact GELU, AdamW lr 1e-3 with
    betas (0.9, 0.99), 100 warmup steps, cosine to 1e-4, bfloat16 autocast), with a shorter
    schedule and a stop at the best val loss. nanoGPT's run decays over 5000 steps, though
    its val loss is best near 2000 (docs/performance-gpu.md#nanogpt-on-a-gpu), so this one
    decays over 2000, evaluates every 250 steps on 50 batches of each split (819,200
    tokens), and stops after two evaluations without a better val loss, keeping the best
    one's checkpoint (`patience`). Fused AdamW (make_optimizer) runs one kernel per step on
    CUDA too. At this size a step is hundreds of short kernels, launch-bound: on one GPU
    (`processes` 1) the whole step is recorded as one CUDA graph and replayed (`cuda_graph`,
    train/graph_step.py), uncompiled, since a compilation costs the run more seconds than its
    faster steps win back before val 1.47; several processes (DDP, which a step graph does
    not record) compile the model instead. Measured: docs/gpu.md#the-gpu-recipe."""
    model = GPTConfig(vocab_size=vocab_size, block_size=256, n_layer=6, n_head=6, n_embd=384,
                      dropout=0.2, bias=False, gelu="exact")
    return model, TrainConfig(
        max_iters=2000, batch_size=64, lr=1e-3, min_lr=1e-4, warmup_iters=100, beta2=0.99,
        eval_interval=250, eval_iters=50, dtype="bfloat16", patience=2,
        cuda_graph=processes == 1, compile=processes > 1)


def seed_experiment(
    name: str, dataset: Dataset | None = None
) -> tuple[GPTConfig, TrainConfig, Dataset]:
    """The hello-world and animals experiments on the one-layer `seed-minimal` model, after
    "Understanding Causal Attention" (docs/notebooks/002_hello_world_and_animals.ipynb).

    hello: SGD lr 0.1 for 1000 steps on "Hello World!", as in the original.
    animals: n_embd 5, AdamW lr 3e-2 decayed (cosine) to 3e-3 over 600 steps (the original: lr
    1e-4 for 10,000). At a constant 3e-2 the loss spikes now and then after it reaches its
    floor, so the last step's predictions hung on where the spikes fell, which a CPU's float32
    rounding moves; the decay ends in a calm minimum. What the model learns depends on its
    initial weights: seed 17, used here, is one whose " a"/" an" row puts its largest weight
    on the noun in all six sentences; others encode the noun in how that row splits its
    weight between " is" and " a" (docs/inspect.md#the-seed-experiments-attnlab-demo).
    """
    dataset = dataset if dataset is not None else load_dataset(name)
    vocab = dataset.tokenizer.vocab_size
    if name == "hello":
        model = GPTConfig.from_name("seed-minimal", vocab_size=vocab)
        config = TrainConfig(max_iters=1000, lr=0.1, optimizer="sgd", warmup_iters=0,
                             decay_lr=False, grad_clip=0.0, eval_interval=1000, eval_iters=1,
                             batch_size=1, seed=1337)
    elif name == "animals":
        model = GPTConfig.from_name("seed-minimal", vocab_size=vocab, n_embd=5)
        config = TrainConfig(max_iters=600, lr=3e-2, warmup_iters=0, decay_lr=True,
                             weight_decay=0.0, grad_clip=0.0, eval_interval=600, eval_iters=1,
                             batch_size=6, beta2=0.999, seed=17)
    else:
        raise ValueError(f"unknown seed experiment {name!r}; choose hello or animals")
    return model, config, dataset


#: Held-out task examples are drawn from seed HELD_OUT + seed: training draws its batches
#: from its own small seed (`--seed 0` drew exactly the examples seed 0 gives), never from one
#: this large (below 2**32: the CPU generator reads a seed's low 32 bits).
HELD_OUT = 3_000_000_000


@torch.no_grad()
def answer_accuracy(
    model: GPT, dataset: TaskDataset, n: int = 256, seed: int = 0, edits: Edit | Edits | None = None
) -> tuple[float, list[tuple[str, str, str]]]:
    """Greedy exact-match accuracy on n fresh task examples (held out: `HELD_OUT`), and
    (prompt, answer, got) rows.

    edits: score the model with these `interp.edits.Edits` applied (e.g. heads ablated)."""
    from ..generate import generate

    gen = torch.Generator().manual_seed(HELD_OUT + seed)  # draws the examples on the host
    examples = [dataset.sample(gen) for _ in range(n)]
    tok = dataset.tokenizer
    prompts = torch.tensor([tok.encode(p) for p, _ in examples],
                           device=model.wte.weight.device)  # (n, P): equal lengths
    was_training = model.training
    model.eval()
    out = generate(model, prompts, max_new_tokens=len(examples[0][1]), temperature=0,
                   vocab_size=tok.vocab_size, edits=edits)  # (n, P + A)
    model.train(was_training)
    rows = [(p, a, tok.decode(ids[prompts.shape[1]:].tolist()))
            for (p, a), ids in zip(examples, out, strict=True)]
    return sum(a == got for _, a, got in rows) / n, rows
