"""What `attnlab train` prints about a run: the run described before it starts, and after
it what it reached, what it learned (a task's answer accuracy, the sentences' last words, or
a text sample) and what to run next. `cli/train.py` runs it."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path
from typing import Any

from .common import check_device, count


def resume_command(args: argparse.Namespace, out: Path) -> str:
    """The command that continues the run in `out`: the checkpoint holds the run's configs
    and tokenizer, so these three flags are enough; a run under torchrun continues under it,
    with as many processes on as many nodes (it may take another count: docs/train.md)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))  # torchrun's processes per node
    if world == 1:
        launch = "attnlab"
    elif local == world:
        launch = f"torchrun --standalone --nproc_per_node {world} -m attnlab"
    else:  # several nodes: their rendezvous (host, port, id) is the user's to give again
        launch = (f"torchrun --nnodes {world // local} --nproc_per_node {local} "
                  "<this run's --rdzv flags, on each node> -m attnlab")
    return (f"{launch} train --data {shlex.quote(args.data)} --out {shlex.quote(str(out))} "
            "--resume")


def say_last_checkpoint(args: argparse.Namespace, out: Path) -> None:
    """On stderr, after a second Ctrl-C quit at once: where the last saved checkpoint is (its
    saves are atomic, so it is whole) and how to continue from it, or that none was saved."""
    from ..checkpoint import read_config

    ckpt = out / "ckpt"
    try:
        step = read_config(ckpt)[1].get("step")
    except (OSError, ValueError):  # none yet (or unreadable: said by --resume)
        print("quit before the first checkpoint: nothing saved", file=sys.stderr)
        return
    print(f"quit: the last checkpoint, at step {step}, is {ckpt}; continue with: "
          f"{resume_command(args, out)}", file=sys.stderr)


def report(args: argparse.Namespace, result: Any, dataset: Any, out: Path,
            train_config: Any) -> int:
    """Print what the run reached and where it is, what it learned and what to run next: the
    exit code (130: interrupted, with the command that continues it)."""
    from ..train.data import SentenceDataset, TaskDataset

    if result.val_loss is not None:
        bits = "" if result.val_bpb is None else f", {result.val_bpb:.3f} bits/byte"
        budget = (" since resuming" if args.resume else
                  f" of a {train_config.time_budget} budget" if train_config.time_budget else "")
        # an interrupted run's checkpoint is past its last evaluation: say which step that was
        at = f" at step {result.val_step} (the last evaluation)" if result.interrupted else ""
        if train_config.patience is not None:  # the checkpoint holds the best evaluation
            at = f" at step {result.val_step} (the best evaluation)"
        print(
            f"val loss {result.val_loss:.4f}{bits}{at}  ({result.seconds:.1f} s{budget}, "
            f"{result.tokens_per_second:,.0f} tokens/s training)"
        )
    if result.stopped_early:
        print(f"stopped  at step {result.history[-1]['step']}: "
              f"{count(train_config.patience, 'evaluation')} without a better val loss than "
              f"step {result.val_step}'s, whose weights the checkpoint keeps (--patience)")
    if result.interrupted:
        print(f"interrupted: checkpoint saved in {result.checkpoint}; continue with: "
              f"{resume_command(args, out)}")
        return 130
    example = "..."  # a prompt for the "next" line's generate
    if isinstance(dataset, TaskDataset):
        example = report_task(result.model, dataset, "after")
    elif isinstance(dataset, SentenceDataset):
        example = report_sentences(result.model, dataset)
    else:
        sample_text(result.model, dataset)
    print(
        f"saved    {result.checkpoint}  (metrics: {out / 'metrics.jsonl'}, "
        f"curve: {out / 'loss.png'})"
    )
    print(
        f"next     attnlab info {result.checkpoint}\n"
        f"         attnlab generate {result.checkpoint} {shlex.quote(example)}\n"
        f"         attnlab serve {result.checkpoint}"
    )
    return 0


def describe(dataset: Any, model_config: Any, train_config: Any, resumed: bool) -> None:
    from ..model.gpt import count_params
    from ..train.budget import CALIBRATION_STEPS, UNTIMED_STEPS, parse_duration
    from ..train.distributed import processes

    n_params = count_params(model_config)
    tc = train_config
    print(f"data     {dataset.describe()}")
    print(
        f"model    {count(model_config.n_layer, 'layer')}, "
        f"{count(model_config.n_head, 'head')}, "
        f"{model_config.n_embd} dims, context {model_config.block_size}: "
        + (f"{n_params / 1e6:.2f}M parameters" if n_params >= 10_000 else
           f"{n_params:,} parameters")
    )
    steps = count(tc.max_iters, "step")
    if tc.time_budget and resumed:  # the steps were fitted when the run started
        steps += f" (the run began with a {tc.time_budget} budget)"
    elif tc.time_budget:
        steps = (f"{tc.time_budget} ({parse_duration(tc.time_budget):g} s; steps fitted to the "
                 f"speed of the first {UNTIMED_STEPS + CALIBRATION_STEPS})")
    world = processes()
    if world > 1:
        print(f"world    {world} processes (torchrun, DistributedDataParallel): each step's "
              f"{tc.batch_size} sequences split {tc.batch_size // world} per process")
    device = check_device(tc.device)
    print(
        f"train    {steps} x {tc.batch_size * tc.grad_accum} sequences, "
        f"{tc.optimizer} lr {tc.lr:g}, {tc.dtype}"
        + ("" if device.type == "cpu" else f" on {device}")
        + (", each step one CUDA graph" if tc.cuda_graph else "")
        + ("" if tc.patience is None else
           f", stopping after {count(tc.patience, 'evaluation')} without a better val loss")
    )


def report_task(model: Any, dataset: Any, when: str) -> str:
    """Print the answer accuracy on held-out examples and three of them: the first one's
    prompt (a prompt the task's tokenizer encodes, for the "next" line)."""
    from ..train.recipes import answer_accuracy

    accuracy, rows = answer_accuracy(model, dataset, n=256)
    print(f"{when:<8} answer accuracy {accuracy:.1%} on 256 held-out examples")
    for prompt, answer, got in rows[:3]:
        mark = "✓" if got == answer else "✗"
        print(f"           {prompt}{got}   {mark} (expected {answer})")
    return str(rows[0][0])


def report_sentences(model: Any, dataset: Any) -> str:
    import torch

    with torch.no_grad():
        logits = model(dataset.ids[:, :-1].to(model.wte.weight.device)).logits[:, -1]  # (N, V)
    rows = dataset.last_word_predictions(logits.argmax(-1))
    right = sum(expected == got for _, expected, got in rows)
    print(f"after    last word right in {right}/{len(rows)} sentences")
    for prompt, expected, got in rows:
        print(f"           {prompt!r} -> {got!r}  {'✓' if got == expected else '✗'}")
    return str(rows[0][0])


def sample_text(model: Any, dataset: Any) -> None:
    from ..generate import generate_text

    tok = dataset.tokenizer
    start = tok.decode([int(dataset.val[0])])
    n = min(200, model.config.block_size - 1)
    text = generate_text(model, tok, [start], max_new_tokens=n, temperature=0.8, top_k=0, seed=0)[0]
    print(f"sample   (temperature 0.8, {n} tokens)\n{start}{text}")
