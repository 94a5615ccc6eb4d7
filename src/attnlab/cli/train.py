"""`attnlab train`: train a model on a built-in task or your own text, and show what it learned.

With no arguments it trains on the `copy` task (repeat the letters after the bar), which a
transformer can only solve with attention (an induction head), small enough to learn on a
CPU while you wait (docs/performance.md#the-copy-task), and prints the answer accuracy
before and after.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
from pathlib import Path
from typing import Any

from .common import (
    CLIError,
    add_config_flags,
    add_force_flag,
    add_threads_flag,
    apply_threads,
    check_device,
    check_out,
    config_from_flags,
    config_overrides,
    cpu_memory_errors,
    load_opened,
    out_of_memory,
)
from .progress import Progress, tokenizing_shown
from .train_report import describe, report, report_task, resume_command, say_last_checkpoint
from .train_resume import resume_run, run_data


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    from ..model.config import PRESETS, GPTConfig
    from ..train.config import TrainConfig
    from ..train.data import BUILTINS
    from ..train.recipes import ARCHS

    parser = subparsers.add_parser(
        "train",
        help="train a model (default: the copy task, under a minute on a CPU)",
        description="Train a GPT on a built-in dataset or a text file. Every field of "
        "GPTConfig and TrainConfig is a flag (--n_layer 4 --lr 1e-3).",
    )
    parser.add_argument(
        "--data",
        default=None,
        help=f"a text file, a directory of .txt files (subdirectories included), or one of "
        f"{', '.join(BUILTINS)} "
        "(default: copy; with --resume, the data the run trained on)",
    )
    parser.add_argument(
        "--tokenizer",
        help="for text: char, byte, word, bpe[:VOCAB], tiktoken:NAME, a tokenizer.json path or "
        "a checkpoint directory to reuse its tokenizer (default: char, or the run's own when "
        "resuming; built-in datasets bring their own)",
    )
    parser.add_argument(
        "--arch",
        choices=ARCHS,
        help="block style of the recipe's model: gpt2 (learned positions, LayerNorm, GELU, "
        "biases; default), llama (RoPE, RMSNorm, SwiGLU, no biases), gemma3 (RoPE, "
        "Gemma's RMSNorm before and after each branch and on q and k, GeGLU, scaled "
        "embeddings, no biases), olmo2 (llama's, with RMSNorm after each branch only and "
        "on the whole q and k) or phi (RoPE on half of each head, attention and MLP side "
        "by side on one LayerNorm, biases, the head's too) at the same parameter count",
    )
    parser.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        help="the model's shape (layers, heads, width) from a named preset instead of the "
        "dataset's recipe; the context (--block_size) and the schedule (--lr, --max_iters, "
        "...) stay the recipe's unless given",
    )
    parser.add_argument(
        "--init_from", metavar="DIR",
        help="fine-tune: start from this attnlab checkpoint or Hugging Face model directory "
        "(its config, weights and tokenizer) instead of a fresh model; the schedule stays "
        "the recipe's unless given (--lr, --max_iters, ...), and of the model flags only "
        "the training ones apply (--dropout, --router_aux_loss_coef)",
    )
    add_force_flag(parser)
    parser.add_argument("--out", help="run directory (default: runs/<data name>)")
    parser.add_argument(
        "--resume", action="store_true", help="continue the run in --out from its checkpoint"
    )
    parser.add_argument(
        "--overwrite", action="store_true",
        help="start over even if --out holds a checkpoint (deleted before training starts)"
    )
    add_threads_flag(parser, "CPU threads for torch (default: torch's choice, fewer where "
                             "other work keeps cores busy; small models are often fastest "
                             "with 1)")
    parser.add_argument("--quiet", action="store_true",
                        help="no progress bar or progress lines (evaluations still print)")
    # the dataclass defaults: a run starts from its dataset's recipe (the data/model/train
    # lines it prints), and these flags change that
    add_config_flags(parser, GPTConfig, "model (GPTConfig; the run starts from its data's "
                     "recipe, printed as its 'model' line, and these flags change it)")
    add_config_flags(parser, TrainConfig, "training (TrainConfig; the run starts from its "
                     "data's recipe, printed as its 'train' line)")
    return parser


# report's exit status for a run stopped on request (128 + SIGINT, what a shell gives Ctrl-C)
STOPPED = 130


def run(args: argparse.Namespace) -> int:
    if _rank_0():
        status = _run(args)
    else:  # under torchrun only rank 0 speaks
        args.quiet = True
        with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):
            try:
                status = _run(args)
            except KeyboardInterrupt:  # quit at once (a second Ctrl-C): rank 0 says so
                return STOPPED
    # a stop all ranks took at the same step: one process per torchrun (its local rank 0)
    # exits with its status, so torchrun's report names that one, with the resume line it
    # wrote (tell_torchrun), and torchrun does not kill it mid-report, as it kills the rest
    # once one exits non-zero (docs/train.md#stopping-a-torchrun-run)
    return 0 if status == STOPPED and os.environ.get("LOCAL_RANK", "0") != "0" else status


def _run(args: argparse.Namespace) -> int:
    from ..checkpoint import read_config
    from ..train.data import TaskDataset
    from ..train.distributed import processes, tell_torchrun
    from ..train.graph_step import check_graph_device

    _check_flags(args)
    # a resume finds its checkpoint first: it reads the data with the run's tokenizer
    data_given, args.data = args.data is not None, args.data or "copy"
    _check_run_dir(check_out(_out_dir(args)))  # before the data, model and first evaluation
    found = _find_run(args) if args.resume else None
    saved = None if found is None else read_config(found)  # (model config, meta), read once
    if found is not None and saved is not None and not data_given:
        args.data = run_data(found, saved[1])
    trained_on = None if saved is None else saved[1].get("dataset")
    dataset, init = _load_data(args, found, data_given, trained_on)

    if args.resume:
        assert found is not None
        assert saved is not None
        resumed = resume_run(args, found, saved, dataset)
        if resumed is None:  # a finished run: said so
            return 0
        model_config, train_config, step = resumed
    else:
        model_config, train_config = _new_configs(args, dataset, init)
    out = _out_dir(args)
    # before anything runs: a step graph records on one CUDA GPU only
    check_graph_device(train_config.cuda_graph, check_device(train_config.device), processes())

    describe(dataset, model_config, train_config, resumed=args.resume)
    if args.resume:
        print(f"resumed  from step {step} of {train_config.max_iters} ({out / 'ckpt'})")
    elif init is not None:
        print(f"init     the weights of {init.path}")
    elif isinstance(dataset, TaskDataset):
        import torch

        from ..model.gpt import GPT

        torch.manual_seed(train_config.seed)  # the untrained model train() starts from
        report_task(GPT(model_config), dataset, "before")
    try:
        result = _train(args, model_config, train_config, dataset, out, init)
    except KeyboardInterrupt:  # a second Ctrl-C: quit at once, the last save kept
        if _rank_0():  # said once, under torchrun too
            say_last_checkpoint(args, out)
        raise
    status = report(args, result, dataset, out, train_config)
    if result.interrupted and os.environ.get("LOCAL_RANK", "0") == "0":  # see run()
        tell_torchrun(f"interrupted: checkpoint saved in {result.checkpoint}; continue with: "
                      f"{resume_command(args, out)}")
    return status


def _rank_0() -> bool:
    """Whether this is the process that speaks and writes: rank 0 under torchrun, or the one."""
    return os.environ.get("RANK", "0") == "0"


def _check_flags(args: argparse.Namespace) -> None:
    """Apply --threads and refuse flags that contradict each other, before anything is read."""
    apply_threads(args, share=True)
    if args.resume and args.overwrite:  # resumed silently, the old run kept
        raise CLIError("--resume continues the run in --out and --overwrite deletes it to "
                       "start over: choose one")
    if args.resume and args.init_from:  # before the resume looks for its checkpoint
        raise CLIError("--init_from starts a new run from a model and --resume continues the "
                       "run in --out (whose checkpoint holds its own weights): choose one")


def _check_run_dir(out: Path) -> None:
    """Refuse an --out that is a model directory itself (an attnlab checkpoint or a Hugging
    Face directory): the run would save into out/ckpt, where nothing that loads `out` looks."""
    if (out / "config.json").is_file():
        run = f"--out {out.parent}" if out.name == "ckpt" else "--out DIR of its own"
        raise CLIError(f"--out {out} holds a model (config.json); a run keeps its checkpoint "
                       f"in DIR/ckpt: pass {run}")


def _load_data(args: argparse.Namespace, found: Path | None, data_given: bool,
               trained_on: str | None = None) -> tuple[Any, Any]:
    """(the dataset, the --init_from checkpoint or None). Text is read with the tokenizer
    the weights learned: a resumed run's own, or the fine-tuned model's."""
    from ..tokenizers import CannotEncode
    from ..train.data import BUILTINS, load_dataset

    tokenizer = args.tokenizer
    if tokenizer is not None and args.data in BUILTINS:  # it would be ignored
        raise CLIError(f"--tokenizer {tokenizer}: the built-in dataset {args.data!r} brings "
                       "its own tokenizer; drop --tokenizer, or train on a text file")
    if found is not None and args.resume and tokenizer is None:
        tokenizer = str(found)  # the run's own tokenizer (a trained BPE is not redrawn)
    init = _init_source(args, data_given) if args.init_from else None
    if init is not None:
        tokenizer = str(init.path)  # its ids are the ones the weights learned
    try:  # a first tokenization's progress: on stderr, by rank 0 alone (run() quiets the rest)
        with tokenizing_shown(quiet=args.quiet or not _rank_0()) as (progress, training):
            return load_dataset(args.data, tokenizer or "char", progress=progress,
                                training=training), init
    except CannotEncode as err:
        if init is None and found is None:
            raise
        # its advice (another tokenizer) is not open to a fine-tune or a resume: the weights
        # learned these tokens
        fix = (f"the model of --init_from {args.init_from} reads only its own tokenizer's "
               "tokens, so give data they cover") if init is not None else (
               f"the run in {found} trained on {trained_on!r}: resume on that")
        raise CLIError(f"--data {args.data}: {err.what}; {fix}") from None


def _new_configs(args: argparse.Namespace, dataset: Any, init: Any) -> tuple[Any, Any]:
    """(model config, train config) of a new run: the data's recipe (or the --init_from
    model, or a --preset shape) with the flags given applied. An old run in --out is refused,
    or with --overwrite its checkpoint removed."""
    from ..model.gpt import GPTConfig
    from ..train.config import TrainConfig
    from ..train.distributed import processes
    from ..train.loop import sequence_length
    from ..train.recipes import recipe

    if args.preset and args.arch not in (None, "gpt2"):
        raise CLIError(f"--arch {args.arch} and --preset {args.preset}: choose one")
    device = config_overrides(args, TrainConfig).get("device", "auto")
    try:  # a GPU gets a GPU-sized recipe for text
        model_config, train_config = recipe(dataset, args.arch or "gpt2",
                                            check_device(device).type, processes())
    except ValueError as e:
        raise CLIError(str(e)) from None
    if init is not None:  # the source's model, whatever the recipe's shape
        model_config = dataclasses.replace(
            init.model.config, **config_overrides(args, GPTConfig))
    else:
        if args.preset:
            model_config = GPTConfig.from_name(
                args.preset,
                vocab_size=dataset.tokenizer.vocab_size,
                block_size=model_config.block_size,
            )
        model_config = config_from_flags(args, GPTConfig, model_config)
    if init is None and "vocab_size" not in config_overrides(args, GPTConfig):
        model_config = dataclasses.replace(
            model_config, vocab_size=dataset.tokenizer.vocab_size)
    given = config_overrides(args, TrainConfig)
    if "cuda_graph" not in given and (given.get("optimizer", "adamw") != "adamw"
                                      or model_config.n_experts is not None):
        # it records AdamW's step, and one fixed step (a mixture's shapes change each step)
        train_config = dataclasses.replace(train_config, cuda_graph=False)
    train_config = config_from_flags(args, TrainConfig, train_config)
    if "warmup_iters" not in given:  # the recipe's warmup, fitted to a short --max_iters
        train_config = dataclasses.replace(
            train_config, warmup_iters=train_config.warmup_for(train_config.max_iters))
    if "time_budget" in given and "max_iters" in given:
        raise CLIError(f"--time_budget {train_config.time_budget} and --max_iters "
                       f"{train_config.max_iters}: choose one (a budget sets the steps)")
    try:  # a task too long for --block_size: refused now, not in the "before" report
        sequence_length(model_config, dataset, train_config.seq_len)
    except ValueError as err:
        raise CLIError(str(err)) from None
    old = _find_run(args)  # refuses to overwrite a run unless --overwrite
    if old is not None:  # --overwrite: the old run's checkpoint goes, not later
        if _rank_0():  # under torchrun: one process deletes it
            _remove_checkpoint(_out_dir(args) / "ckpt")
        print(f"removed  the checkpoint {old} held (--overwrite)")
    return model_config, train_config


def _train(args: argparse.Namespace, model_config: Any, train_config: Any, dataset: Any,
           out: Path, init: Any) -> Any:
    """Run `train` with a progress bar: the TrainResult."""
    from ..train.loop import train

    if train_config.compile:
        print("compile  torch.compile: the first step compiles the model (tens of seconds)")
    import torch

    from ..checkpoint import find_checkpoint

    progress = Progress(train_config.max_iters, quiet=args.quiet)
    try:
        with cpu_memory_errors():
            return train(
                model_config, train_config, dataset, out, resume=args.resume,
                callback=progress, init=init,
            )
    except torch.OutOfMemoryError as err:  # the last checkpoint was saved whole (atomic)
        kept = find_checkpoint(out / "ckpt")
        error = out_of_memory("train", err, check_device(train_config.device))
        raise CLIError(f"{error}; the last checkpoint "
                       + (f"is intact: {kept}" if kept else "was never written")) from None
    finally:
        progress.close()


def _init_source(args: argparse.Namespace, data_given: bool) -> Any:
    """The checkpoint --init_from names (attnlab's or a Hugging Face directory), after
    refusing the flags that would contradict it: its model and tokenizer are the run's."""
    from ..load import open_checkpoint
    from ..model.gpt import GPTConfig
    from ..model.memory import Use
    from ..train.config import TrainConfig
    from ..train.data import BUILTINS

    if not data_given:
        raise CLIError("--init_from needs --data: the text file or folder to fine-tune on")
    if args.data in BUILTINS:  # a built-in brings its own tokenizer, not the model's
        raise CLIError(f"--init_from fine-tunes on text; --data {args.data} is a built-in "
                       "task with its own tokenizer: give a text file or folder")
    # a fine-tune keeps the model; these say only how it trains
    model_flags = sorted(set(config_overrides(args, GPTConfig))
                         - {"dropout", "router_aux_loss_coef"})
    given = [f"--{n}" for n in model_flags] + [
        f"--{n}" for n in ("arch", "preset", "tokenizer") if getattr(args, n) is not None]
    if given:
        raise CLIError(f"--init_from {args.init_from} brings its model and tokenizer; "
                       f"{', '.join(given)} would change them (of the model flags only "
                       "the training ones apply: --dropout, --router_aux_loss_coef)")
    try:
        opened = open_checkpoint(args.init_from)
        # loaded in float32 on the CPU (train's --dtype is autocast, its --device the run's:
        # load_opened sees neither); training on the CPU then holds its own copy of the
        # weights, their gradients and AdamW's two moments beside it
        device = config_overrides(args, TrainConfig).get("device", "auto")
        on_cpu = check_device(device).type == "cpu"
        n = sum(p.numel() for p in opened.weights.model.parameters())
        uses = [Use("training's copy of the weights, gradients and AdamW's two moments",
                    elements=4 * n)] if on_cpu else []
        init = load_opened(args, opened, uses)
    except (CLIError, OSError, ValueError) as err:
        raise CLIError(f"--init_from {args.init_from}: {err}") from None
    init.path = Path(args.init_from)
    return init


def _out_dir(args: argparse.Namespace) -> Path:
    """--out, or runs/<the data's name> (the name load_dataset gives it)."""
    from ..train.data import BUILTINS

    name = args.data if args.data in BUILTINS else Path(args.data).name
    return Path(args.out) if args.out else Path("runs") / _slug(name)


def _find_run(args: argparse.Namespace) -> Path | None:
    """The run's checkpoint (ckpt, or the copy a kill between two renames left); refuses a
    run directory that holds one unless --resume or --overwrite says what to do with it."""
    from ..checkpoint import find_checkpoint

    ckpt = _out_dir(args) / "ckpt"
    found = find_checkpoint(ckpt)
    if args.resume and found is None:
        raise CLIError(f"--resume: no checkpoint in {ckpt}; train without --resume first")
    if found is not None and not (args.resume or args.overwrite):
        raise CLIError(
            f"{ckpt} already holds a checkpoint; pass --resume to continue it, --overwrite "
            "to start over, or --out DIR for a new run"
        )
    return found


def _remove_checkpoint(ckpt: Path) -> None:
    """Delete the checkpoint saved as `ckpt`, with the copies an interrupted save left: a
    failed new run must not leave the old run's weights beside its own metrics."""
    import shutil

    from ..checkpoint import find_checkpoint

    while (found := find_checkpoint(ckpt)) is not None:
        shutil.rmtree(found)


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in Path(name).stem) or "run"
