"""Training: the schedule, learning, reproducibility, exact resume, interruption, bad input."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import os
import signal
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from attnlab.checkpoint import STATE_FILE
from attnlab.load import load_checkpoint
from attnlab.model import runtime
from attnlab.model.gpt import GPT, GPTConfig, count_params
from attnlab.model.runtime import SlowBF16Warning
from attnlab.train.data import SentenceDataset, TaskDataset, TextDataset, load_dataset
from attnlab.train.loop import TrainConfig, make_optimizer, train
from attnlab.train.recipes import answer_accuracy, arch_of, recipe, seed_experiment


def _losses(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The history without wall-clock fields, which differ between any two runs."""
    return [{k: v for k, v in row.items() if k != "tokens_per_s"} for row in history]


def _small(dataset: Any, **overrides: Any) -> tuple[GPTConfig, TrainConfig]:
    model = GPTConfig(vocab_size=dataset.tokenizer.vocab_size, block_size=dataset.max_block_size,
                      n_layer=1, n_head=2, n_embd=16, dropout=0.1)
    config = TrainConfig(max_iters=30, batch_size=4, lr=3e-3, warmup_iters=5, eval_interval=10,
                         eval_iters=2, seed=3)
    fields = model.to_dict()
    model = GPTConfig(**{**fields, **{k: v for k, v in overrides.items() if k in fields}})
    rest = {k: v for k, v in overrides.items() if k not in fields}
    return model, TrainConfig(**{**config.__dict__, **rest})


def test_schedule_warms_up_then_decays_to_min_lr() -> None:
    c = TrainConfig(max_iters=100, lr=1.0, warmup_iters=10, min_lr=0.1)
    lrs = [c.lr_at(s) for s in range(101)]
    assert lrs[0] < lrs[5] < lrs[9] < 1.0
    assert lrs[10] == pytest.approx(1.0)
    assert all(a >= b for a, b in itertools.pairwise(lrs[10:]))
    assert lrs[100] == pytest.approx(0.1)
    assert TrainConfig(decay_lr=False, warmup_iters=0).lr_at(1999) == 1e-3


def test_weight_decay_on_matrices_only() -> None:
    """Every matrix decays but a per-head QK-norm's gain (Command R+'s, (heads, hs))."""
    model = GPT(GPTConfig.from_name("nano", qk_norm=True, qk_norm_heads="cohere"))
    groups = make_optimizer(model, TrainConfig()).param_groups
    decayed = {id(p) for p in groups[0]["params"]}
    assert groups[0]["weight_decay"] == 0.1 and groups[1]["weight_decay"] == 0.0
    gains = 0
    for name, p in model.named_parameters():
        gain = name.endswith(("q_norm.weight", "k_norm.weight"))
        gains += gain and p.dim() == 2
        assert (id(p) in decayed) == (p.dim() >= 2 and not gain), name
    assert gains == 4


def test_bad_configs_name_the_value() -> None:
    with pytest.raises(ValueError, match=r"max_iters=0"):
        TrainConfig(max_iters=0)
    with pytest.raises(ValueError, match="optimizer='adam'"):
        TrainConfig(optimizer="adam")
    with pytest.raises(ValueError, match="dtype='float16'"):
        TrainConfig(dtype="float16")


def test_the_text_recipe_takes_a_lower_lr_and_decays_to_a_tenth_of_it(tmp_path: Path) -> None:
    """`attnlab train --data text --lr 3e-4` (a fine-tuning lr) was refused: the recipe fixed
    min_lr at 4e-4, its own lr / 10, so any --lr below that failed validation."""
    (tmp_path / "text.txt").write_text("the quick brown fox jumps over the lazy dog\n" * 60)
    dataset = load_dataset(str(tmp_path / "text.txt"), "char", cache_dir=tmp_path)
    _, config = recipe(dataset)
    for lr in (4e-3, 3e-4):
        lowered = dataclasses.replace(config, lr=lr)  # what the CLI's --lr does
        assert lowered.lr_at(lowered.max_iters) == pytest.approx(lr / 10)


def test_learns_the_copy_task(tmp_path: Path) -> None:
    dataset = load_dataset("copy")
    assert isinstance(dataset, TaskDataset)
    model_config, config = recipe(dataset)
    config = TrainConfig(**{**config.__dict__, "max_iters": 250})
    result = train(model_config, config, dataset, tmp_path)
    losses = [r["loss"] for r in result.history if "loss" in r]
    assert losses[-1] < 0.1 * losses[0]
    accuracy, rows = answer_accuracy(result.model, dataset, n=64)
    assert accuracy >= 0.9, rows[:4]
    logged = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in logged] == result.history
    assert (tmp_path / "loss.png").stat().st_size > 1000
    assert load_checkpoint(tmp_path / "ckpt").meta["step"] == 250


def test_tokens_per_second_is_the_steps_after_the_first(tmp_path: Path) -> None:
    """--compile's first step (tens of seconds) made the summary say 1,040 tokens/s beside a
    progress line of 54k: the figure is the steps' own, after the first, evaluations out."""
    dataset = load_dataset("reverse")
    model_config, config = _small(dataset, max_iters=6, eval_interval=2)
    result = train(model_config, config, dataset, tmp_path)
    steps = [r for r in result.history if "tokens_per_s" in r]
    tokens = config.batch_size * model_config.block_size
    seconds = sum(tokens / r["tokens_per_s"] for r in steps[1:])
    assert len(steps) == 6 and result.tokens_per_second == pytest.approx(5 * tokens / seconds)
    assert result.seconds > seconds


def test_the_result_reads_as_its_outcome_in_a_notebook(tmp_path: Path) -> None:
    """`train(...)` as a notebook cell's last line printed the model's modules and every
    step's metrics row before val_loss: 707 rows for the text recipe."""
    dataset = load_dataset("reverse")
    result = train(*_small(dataset, max_iters=6, eval_interval=3), dataset, tmp_path)
    text = repr(result)
    assert "val_loss=" in text and "checkpoint=" in text
    assert "Linear" not in text and "tokens_per_s'" not in text and len(text) < 500


def test_same_seed_same_losses(tmp_path: Path) -> None:
    dataset = load_dataset("reverse")
    model_config, config = _small(dataset, max_iters=8)
    a = _losses(train(model_config, config, dataset, tmp_path / "a").history)
    b = _losses(train(model_config, config, dataset, tmp_path / "b").history)
    assert a == b
    c = _losses(train(model_config, TrainConfig(**{**config.__dict__, "seed": 4}), dataset,
                      tmp_path / "c").history)
    assert a != c


def _interrupt_at(step: int) -> Any:
    def callback(row: dict[str, Any]) -> None:
        if row.get("step") == step and "loss" in row:
            os.kill(os.getpid(), signal.SIGINT)  # what Ctrl-C does

    return callback


@pytest.mark.parametrize(("stop_at", "row_major_moments"), [
    (7, False), (13, False),  # mid-interval, and right after an eval
    (7, True),  # a train state saved before GPT.lay_out_weights: row-major AdamW moments
])
def test_interrupted_and_resumed_equals_uninterrupted(
    tmp_path: Path, stop_at: int, row_major_moments: bool
) -> None:
    dataset = load_dataset("copy")
    model_config, config = _small(dataset)  # dropout 0.1: the torch RNG state matters too
    whole = train(model_config, config, dataset, tmp_path / "whole")

    before = signal.getsignal(signal.SIGINT)  # SIG_IGN where pytest runs in the background
    first = train(model_config, config, dataset, tmp_path / "split",
                  callback=_interrupt_at(stop_at))
    assert first.interrupted
    assert load_checkpoint(tmp_path / "split" / "ckpt").meta["step"] == stop_at
    if row_major_moments:
        path = tmp_path / "split" / "ckpt" / STATE_FILE
        state = torch.load(path, weights_only=True)
        moments = state["optimizer"]["state"].values()
        assert any(not m["exp_avg"].is_contiguous() for m in moments)  # (in, out) weights
        for m in moments:
            m["exp_avg"], m["exp_avg_sq"] = m["exp_avg"].contiguous(), m["exp_avg_sq"].contiguous()
        torch.save(state, path)
    assert signal.getsignal(signal.SIGINT) is before  # handler restored
    seen: list[dict[str, Any]] = []
    rest = train(model_config, config, dataset, tmp_path / "split", resume=True,
                 callback=seen.append)

    assert not rest.interrupted
    # it went on from the checkpoint: a rerun from step 0 would give the same losses too
    resumed = [r["step"] for r in seen if "loss" in r]
    assert resumed == list(range(stop_at + 1, config.max_iters + 1))
    assert _losses(rest.history) == _losses(whole.history)  # every loss, bit for bit
    assert rest.val_loss == whole.val_loss
    for (name, a), b in zip(whole.model.state_dict().items(), rest.model.state_dict().values(),
                            strict=True):
        assert torch.equal(a, b), name
    logged = (tmp_path / "split" / "metrics.jsonl").read_text().splitlines()
    assert _losses([json.loads(line) for line in logged]) == _losses(whole.history)


def test_a_second_ctrl_c_quits_at_once_and_keeps_the_last_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the first Ctrl-C waits for the step (or a long evaluation) to end, then saves; a user
    # who presses it again wants out now
    dataset = load_dataset("copy")
    model_config, config = _small(dataset)

    rows: list[dict[str, Any]] = []

    def callback(row: dict[str, Any]) -> None:
        rows.append(row)
        if row.get("step") == 12 and "loss" in row:
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)

    before = signal.getsignal(signal.SIGINT)  # SIG_IGN where pytest runs in the background
    with pytest.raises(KeyboardInterrupt):
        train(model_config, config, dataset, tmp_path, callback=callback)
    assert signal.getsignal(signal.SIGINT) is before  # handler restored
    assert load_checkpoint(tmp_path / "ckpt").meta["step"] == 10  # the last evaluation's
    assert rows[-1] == {"step": 12, "signal": "SIGINT"}  # told once, at the first


@pytest.mark.skipif(not hasattr(signal, "SIGHUP"), reason="no SIGHUP on this system")
@pytest.mark.parametrize("name", ["SIGTERM", "SIGHUP"])
def test_sigterm_and_sighup_save_and_stop_like_ctrl_c(
    tmp_path: Path, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # SIGHUP (a closed terminal or ssh session) killed the run: the steps since the last
    # evaluation were lost
    sig = getattr(signal, name)

    def unhandled(signum: int, frame: Any) -> None:
        raise RuntimeError(f"{name} reached the handler outside train()")

    dataset = load_dataset("copy")
    model_config, config = _small(dataset)
    old = signal.signal(sig, unhandled)  # stands for the default action, which ends pytest
    try:
        rows: list[dict[str, Any]] = []

        def callback(row: dict[str, Any]) -> None:
            rows.append(row)
            if row.get("step") == 7 and "loss" in row:
                os.kill(os.getpid(), sig)

        result = train(model_config, config, dataset, tmp_path, callback=callback)
        assert signal.getsignal(sig) is unhandled  # restored
    finally:
        signal.signal(sig, old)
    assert result.interrupted
    assert load_checkpoint(tmp_path / "ckpt").meta["step"] == 7
    # told at once (an evaluation of many batches can take seconds before the save), to the
    # callback only: the library prints nothing, and a stop is no metric
    assert rows[rows.index({"step": 7, "signal": name}) - 1]["step"] == 7
    assert capsys.readouterr() == ("", "")
    assert "signal" not in (tmp_path / "metrics.jsonl").read_text()


def test_resume_with_another_model_config_is_refused(tmp_path: Path) -> None:
    dataset = load_dataset("copy")
    model_config, config = _small(dataset, max_iters=3)
    train(model_config, config, dataset, tmp_path)
    other = GPTConfig(**{**model_config.to_dict(), "n_embd": 32})
    with pytest.raises(ValueError, match="resume with the same model flags"):
        train(other, config, dataset, tmp_path, resume=True)


def test_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path: Path) -> None:
    dataset = load_dataset("copy")
    model_config, config = _small(dataset, max_iters=200, eval_interval=5, optimizer="sgd",
                                  grad_clip=0.0, warmup_iters=0, decay_lr=False, lr=1.0)
    good = train(model_config, TrainConfig(**{**config.__dict__, "max_iters": 5}), dataset,
                 tmp_path)
    saved = {k: v.clone() for k, v in good.model.state_dict().items()}
    explode = TrainConfig(**{**config.__dict__, "lr": 1e12})
    with pytest.raises(FloatingPointError, match=r"at step \d+"):
        train(model_config, explode, dataset, tmp_path, resume=True)
    kept = load_checkpoint(tmp_path / "ckpt")
    assert kept.meta["step"] == 5
    for name, value in kept.model.state_dict().items():
        assert torch.equal(value, saved[name]), name


def test_bad_inputs_leave_no_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "small.txt"
    path.write_text("a short text " * 3)
    dataset = load_dataset(str(path), cache_dir=tmp_path / "cache")
    model_config = GPTConfig(vocab_size=dataset.tokenizer.vocab_size, block_size=64, n_layer=1,
                             n_head=1, n_embd=8)
    with pytest.raises(ValueError, match="block_size=64 is larger than the data allows"):
        train(model_config, TrainConfig(max_iters=1), dataset, tmp_path / "run")
    small_vocab = GPTConfig(**{**model_config.to_dict(), "vocab_size": 2, "block_size": 2})
    with pytest.raises(ValueError, match="vocab_size=2 < tokenizer's"):
        train(small_vocab, TrainConfig(max_iters=1), dataset, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_unwritable_output_is_reported_before_training(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    dataset = load_dataset("copy")
    model_config, config = _small(dataset, max_iters=1)
    with pytest.raises(ValueError, match="not writable"):
        train(model_config, config, dataset, blocker / "run")


def test_seed_hello_predicts_world(tmp_path: Path) -> None:
    model_config, config, dataset = seed_experiment("hello")
    assert model_config.mlp == "none" and model_config.norm == "none"
    result = train(model_config, config, dataset, tmp_path)
    assert isinstance(dataset, SentenceDataset)
    with torch.no_grad():
        logits = result.model(dataset.ids[:, :1]).logits[0, -1]
    assert dataset.tokenizer.decode([int(logits.argmax())]) == " World"


def test_seed_animals_predicts_every_last_word(tmp_path: Path) -> None:
    model_config, config, dataset = seed_experiment("animals")
    assert model_config.n_embd == 5
    result = train(model_config, config, dataset, tmp_path)
    assert isinstance(dataset, SentenceDataset)
    with torch.no_grad():
        predicted = result.model(dataset.ids[:, :-1]).logits[:, -1].argmax(-1)
    rows = dataset.last_word_predictions(predicted)
    assert [got for _, _, got in rows] == [want for _, want, _ in rows], rows


@pytest.mark.parametrize("overrides", [{"dtype": "bfloat16"}, {"grad_accum": 3}])
def test_bf16_autocast_and_accumulation_train(
    tmp_path: Path, overrides: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    dataset = load_dataset("copy")
    model_config, config = _small(dataset, max_iters=40, eval_interval=40, dropout=0.0,
                                  **overrides)
    monkeypatch.setattr(runtime, "fast_bf16", lambda: False)  # as on a CPU without the units
    bf16 = config.dtype == "bfloat16"
    with pytest.warns(SlowBF16Warning) if bf16 else contextlib.nullcontext():
        result = train(model_config, config, dataset, tmp_path)
    losses = [r["loss"] for r in result.history if "loss" in r]
    assert losses[-1] < losses[0] - 0.2
    assert result.model.wte.weight.dtype == torch.float32  # autocast leaves the weights alone


def test_attention_path_for_training() -> None:
    from attnlab.train.loop import fused_attention

    cpu = torch.device("cpu")
    assert fused_attention(TrainConfig(), cpu)  # float32: SDPA
    assert not fused_attention(TrainConfig(dtype="bfloat16"), cpu)  # bf16 on CPU: explicit
    assert fused_attention(TrainConfig(dtype="bfloat16"), torch.device("cuda"))
    assert fused_attention(TrainConfig(dtype="bfloat16", attention="fused"), cpu)
    assert not fused_attention(TrainConfig(attention="explicit"), cpu)
    with pytest.raises(ValueError, match="attention='flash'"):
        TrainConfig(attention="flash")
    model = GPT(GPTConfig.from_name("nano"))
    assert make_optimizer(model, TrainConfig()).defaults["fused"] is True


@pytest.mark.parametrize("data", ["copy", "shakespeare"])
def test_llama_gemma3_and_olmo2_recipes_match_the_gpt2_recipe_in_parameters(data: str) -> None:
    """--arch llama keeps the shape and schedule and picks d_ff for the same parameter count
    (within 0.5%): RoPE + RMSNorm + SwiGLU, no biases, no position table; --arch gemma3
    likewise with Gemma 3's blocks."""
    if data == "shakespeare":
        text = Path(__file__).parents[2] / ".." / "shared" / "data" / "tinyshakespeare.txt"
        if not text.is_file():
            pytest.skip("tiny Shakespeare is not in ../shared/data")
        dataset = load_dataset(str(text), "char")
    else:
        dataset = load_dataset(data)
    gpt2, gpt2_train = recipe(dataset)
    llama, llama_train = recipe(dataset, "llama")
    assert gpt2_train == llama_train
    assert (llama.pos, llama.norm, llama.mlp, llama.bias) == ("rope", "rmsnorm", "swiglu", False)
    assert (llama.n_layer, llama.n_head, llama.n_embd) == (gpt2.n_layer, gpt2.n_head, gpt2.n_embd)
    assert abs(count_params(llama) / count_params(gpt2) - 1) < 0.005
    # --arch gemma3 likewise, with Gemma 3's blocks (sandwich norms, QK-norm, GeGLU)
    gemma3, gemma3_train = recipe(dataset, "gemma3")
    assert gemma3_train == gpt2_train
    assert (gemma3.pos, gemma3.norm, gemma3.mlp, gemma3.bias, gemma3.sandwich_norm,
            gemma3.qk_norm, gemma3.scale_embeddings) == ("rope", "gemma_rmsnorm", "geglu",
                                                         False, True, True, True)
    assert (gemma3.n_layer, gemma3.n_head, gemma3.n_embd) == (gpt2.n_layer, gpt2.n_head,
                                                              gpt2.n_embd)
    assert abs(count_params(gemma3) / count_params(gpt2) - 1) < 0.005
    # --arch olmo2: Llama's blocks with norms after each branch alone, whole-width QK-norm
    olmo2, olmo2_train = recipe(dataset, "olmo2")
    assert olmo2_train == gpt2_train
    assert (olmo2.pos, olmo2.norm, olmo2.mlp, olmo2.bias, olmo2.pre_norm, olmo2.sandwich_norm,
            olmo2.qk_norm_whole, olmo2.rope_in_float32) == (
        "rope", "olmo_rmsnorm", "swiglu", False, False, True, True, True)
    assert abs(count_params(olmo2) / count_params(gpt2) - 1) < 0.005
    # --arch phi: attention and MLP side by side on one LayerNorm, a bias on the head
    phi, phi_train = recipe(dataset, "phi")
    assert phi_train == gpt2_train
    assert (phi.pos, phi.rotary_pct, phi.norm, phi.mlp, phi.parallel_residual, phi.shared_norm,
            phi.head_bias) == ("rope", 0.5, "layernorm", "gelu", True, True, True)
    assert abs(count_params(phi) / count_params(gpt2) - 1) < 0.005
    assert [arch_of(c) for c in (gpt2, llama, gemma3, olmo2, phi)] == [
        "gpt2", "llama", "gemma3", "olmo2", "phi"]
    with pytest.raises(ValueError, match="arch='mamba' must be one of"):
        recipe(dataset, "mamba")


def test_text_recipe_steps_grow_with_the_corpus() -> None:
    """About one pass over the training split at the recipe's batch, 700 to MAX_TEXT_STEPS."""
    from attnlab.tokenizers import CharTokenizer
    from attnlab.train.recipes import MAX_TEXT_STEPS

    tokenizer = CharTokenizer.from_text("abc")

    def steps(n_train: int) -> int:
        ids = np.zeros(n_train, dtype=np.uint16)
        _, config = recipe(TextDataset("t", tokenizer, ids, ids[:1000]))
        return config.max_iters

    per_step = 24 * 64  # the recipe's batch x context
    assert steps(1_003_854) == 700  # tiny Shakespeare's training split: a pass is 653 steps
    assert steps(2000 * per_step) == 2000
    assert steps(10**9) == MAX_TEXT_STEPS


def test_an_interrupted_evaluation_leaves_training_mode_as_it_was(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from attnlab.train import evaluate as evaluate_module

    dataset = TaskDataset("copy")
    model_config, config = _small(dataset)
    model = GPT(model_config).train()

    def interrupted(*args: Any) -> float:
        raise KeyboardInterrupt

    monkeypatch.setattr(evaluate_module, "_split_loss", interrupted)
    with pytest.raises(KeyboardInterrupt):
        evaluate_module.evaluate(model, dataset, config, model_config.block_size)
    assert model.training


@pytest.mark.parametrize("seed", [0, 1, 1337])
def test_held_out_examples_are_not_the_training_batches(seed: int) -> None:
    """answer_accuracy's examples come from a seed no training run draws its batches from:
    with --seed 0 they were the first 256 examples it trained on."""
    dataset = TaskDataset("copy")
    model_config, _ = _small(dataset)
    _, rows = answer_accuracy(GPT(model_config).eval(), dataset, n=256, seed=0)
    held_out = {prompt for prompt, _, _ in rows}
    x, _ = dataset.batch("train", 256, dataset.max_block_size,
                         torch.Generator().manual_seed(seed))
    trained = {dataset.tokenizer.decode(row[:9].tolist()) for row in x}
    assert len(held_out) > 250 and len(trained) > 250
    assert held_out.isdisjoint(trained)


def test_warmup_starts_above_zero_and_climbs_linearly_to_lr() -> None:
    """nanoGPT's get_lr: lr * (step + 1) / (warmup + 1), so the first step already trains
    (lr / 11 with 10 warmup steps), never a wasted step at lr 0."""
    c = TrainConfig(max_iters=100, lr=1.0, warmup_iters=10, min_lr=0.1)
    assert c.lr_at(0) == pytest.approx(1 / 11)
    assert c.lr_at(9) == pytest.approx(10 / 11)
    assert c.lr_at(10) == pytest.approx(1.0)


def test_lr_stays_at_min_lr_past_max_iters() -> None:
    """Past max_iters the cosine is over: min_lr, not a cosine climbing back toward lr."""
    c = TrainConfig(max_iters=100, lr=1.0, warmup_iters=10, min_lr=0.1)
    assert c.lr_at(150) == pytest.approx(0.1)
    assert c.lr_at(190) == pytest.approx(0.1)


def test_two_micro_batches_of_4_step_as_one_batch_of_8(tmp_path: Path) -> None:
    """Gradient accumulation averages: with plain SGD (no clipping, constant lr, no dropout)
    one step over grad_accum=2 micro-batches of 4 copy-task examples (all of one length, so
    each micro-batch counts as many targets) moves the weights as one batch of the same 8."""
    dataset = load_dataset("copy")
    model_config = GPTConfig(vocab_size=dataset.tokenizer.vocab_size,
                             block_size=dataset.max_block_size, n_layer=1, n_head=2, n_embd=16,
                             dropout=0.0)
    base = dict(max_iters=1, lr=0.5, warmup_iters=0, decay_lr=False, optimizer="sgd",
                grad_clip=0.0, eval_interval=10, eval_iters=1, seed=3)
    whole = train(model_config, TrainConfig(**base, batch_size=8), dataset, tmp_path / "a")
    split = train(model_config, TrainConfig(**base, batch_size=4, grad_accum=2), dataset,
                  tmp_path / "b")
    for name, value in whole.model.state_dict().items():
        torch.testing.assert_close(split.model.state_dict()[name], value, atol=1e-6, rtol=1e-5,
                                   msg=lambda m, n=name: f"{n}: {m}")


def test_a_resume_refuses_moments_missing_for_one_parameter(tmp_path: Path) -> None:
    """AdamW moments lost for a single parameter would restart it from zero: the run could
    not continue exactly, so the resume is refused (not only when every moment is gone)."""
    dataset = load_dataset("copy")
    model = GPTConfig(vocab_size=dataset.tokenizer.vocab_size,
                      block_size=dataset.max_block_size, n_layer=1, n_head=2, n_embd=16)
    config = TrainConfig(max_iters=4, batch_size=4, lr=3e-3, warmup_iters=1,
                         eval_interval=4, eval_iters=1, seed=3)
    train(model, config, dataset, tmp_path)
    path = tmp_path / "ckpt" / STATE_FILE
    state = torch.load(path, weights_only=True)
    moments = state["optimizer"]["state"]
    del moments[next(iter(moments))]  # one parameter's exp_avg / exp_avg_sq
    torch.save(state, path)
    with pytest.raises(ValueError, match=r"holds moments for \d+ of \d+ parameters"):
        train(model, config, dataset, tmp_path, resume=True)
