"""`attnlab train --resume`: which run to continue, with which configs, and whether it can.

A resumed run keeps its saved model and training configs; only the RESUME_SAFE flags (how
long, how often, where) may change them. A finished run, or one whose checkpoint is damaged,
is said to be so before anything trains.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from .common import CLIError, config_from_flags, config_overrides, count


def resume_run(
    args: argparse.Namespace, found: Path, saved: tuple[Any, dict[str, Any]], dataset: Any
) -> tuple[Any, Any, int] | None:
    """(model config, train config, step) of the run in `found` to continue, after saying what
    changed; None, once said, when the run is finished and nothing is left to train."""
    from ..train.distributed import processes

    model_config, train_config, step, changed = resume_configs(args, found, saved, dataset)
    check_resumable(found, finished=step >= train_config.max_iters)
    # a new --max_iters the run already reached (another changed flag alone, or the
    # run's own end, is a finished run: nothing to resume)
    if step >= train_config.max_iters and any(c.startswith("--max_iters ")
                                              for c in changed):
        raise CLIError(f"--resume: {found} is at step {step}; --max_iters "
                       f"{train_config.max_iters} would not train it further (pass "
                       f"--max_iters N > {step})")
    if step >= train_config.max_iters:
        print(f"finished {found} is at step {step} of {train_config.max_iters}; "
              f"nothing to resume (pass --max_iters N > {step} to train further)")
        return None
    # a --patience run's checkpoint keeps its best evaluation's step, not where it ended
    end = None if train_config.patience is None or changed else patience_end(
        found.parent / "metrics.jsonl", train_config.patience, train_config.max_iters)
    if end is not None:
        print(f"finished {found.parent} ended at step {end} (--patience); its checkpoint "
              f"keeps step {step}'s weights, the best evaluation; nothing to resume")
        return None
    if changed:
        print(f"resume   changed: {', '.join(changed)}")
    before, now = saved[1].get("world_size", 1), processes()
    if before != now and model_config.dropout > 0:  # the data order is the same
        runs = [count(n, "process", "processes") for n in (before, now)]
        print(f"resume   the run used {runs[0]}, this one {runs[1]}: dropout draws other "
              "masks from here, so the losses will not match an uninterrupted run's bit "
              "for bit")
    return model_config, train_config, step


def patience_end(metrics: Path, patience: int, max_iters: int) -> int | None:
    """The step a --patience run ended at, read from its metrics.jsonl: its last evaluation,
    where `patience` evaluations had passed without a better val loss or max_iters was
    reached; None while it has steps left (or the file is gone)."""
    try:
        rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    except (OSError, ValueError):
        return None
    from ..train.state import since_best

    evals = [row for row in rows if "val_loss" in row]
    if not evals:
        return None
    _, stale = since_best([row["val_loss"] for row in evals])
    last = evals[-1]["step"]
    return last if stale >= patience or last >= max_iters else None


# flags a resumed run may change: they decide how long and how often, not what is learned
# from which batches (max_iters also re-fits the rest of the cosine schedule to the new end)
RESUME_SAFE = ("max_iters", "eval_interval", "eval_iters", "compile", "cuda_graph", "device",
               "attention", "patience")


def run_data(ckpt: Path, meta: dict[str, Any]) -> str:
    """The --data a resume of `ckpt` (whose meta is `meta`) reads when none is given: the file
    or directory the run trained on (kept in its checkpoint), or its built-in dataset."""
    from ..train.data import BUILTINS

    name, source = meta.get("dataset"), meta.get("data_source")
    if source is not None and Path(source).exists():
        return str(source)
    if name in BUILTINS:
        return str(name)
    where = f" from {source}, which is gone" if source else ""
    raise CLIError(f"--resume: {ckpt} trained on {name!r}{where}; pass --data PATH to that "
                   "text")


def resume_configs(
    args: argparse.Namespace, ckpt: Path, saved_configs: tuple[Any, dict[str, Any]],
    dataset: Any,
) -> tuple[Any, Any, int, list[str]]:
    """(model config, train config, step, the flags that changed it) a resumed run of `ckpt`
    (whose `read_config` is `saved_configs`) continues with: the saved ones, with only the
    RESUME_SAFE flags given again applied; any other flag that differs from the run's is
    refused, as is other data than the run trained on."""
    from ..model.gpt import GPTConfig
    from ..train.config import TrainConfig
    from ..train.recipes import arch_of

    model_config, meta = saved_configs
    saved = meta.get("train_config")
    if not isinstance(saved, dict) or "step" not in meta:
        raise CLIError(f"--resume: {ckpt} has no training config or step; it was not written "
                       "by attnlab train")
    train_config = TrainConfig(**saved)
    changed: list[str] = []
    fingerprint = getattr(dataset, "fingerprint", None)
    if fingerprint is not None and meta.get("data_fingerprint") == fingerprint and (
            meta.get("dataset") != dataset.name):  # the same text, moved or renamed
        changed.append(f"--data {meta['dataset']} -> {dataset.name} (the same text)")
    elif meta.get("dataset") not in (None, dataset.name):
        raise CLIError(f"--resume: {ckpt} was trained on {meta['dataset']!r}, not "
                       f"{dataset.name!r}; pass --data for that data or --out for a new run")
    if meta.get("data_fingerprint") not in (None, fingerprint):
        raise CLIError(f"--resume: {args.data} is not the text {ckpt} trained on (its "
                       f"contents differ from {meta.get('data_source', 'that file')}'s then); "
                       "pass --data for that text, or --out DIR for a new run")
    refused: list[str] = []
    for cls, base in ((GPTConfig, model_config), (TrainConfig, train_config)):
        for name, value in config_overrides(args, cls).items():
            if value == getattr(base, name):
                continue
            flag = f"--{name} {getattr(base, name)} -> {value}"
            (changed if cls is TrainConfig and name in RESUME_SAFE else refused).append(flag)
    if args.preset:
        refused.append(f"--preset {args.preset}")
    # not config fields, so the loop above does not see them: the run's blocks and tokens
    if args.arch is not None and args.arch != arch_of(model_config):
        refused.append(f"--arch {arch_of(model_config)} -> {args.arch}")
    if args.tokenizer is not None:
        from ..tokenizers import load_tokenizer

        own = load_tokenizer(ckpt)
        if own.identity() != dataset.tokenizer.identity():  # other ids for the same text
            refused.append(f"--tokenizer {own.name} ({own.vocab_size} ids) -> "
                           f"{args.tokenizer} ({dataset.tokenizer.vocab_size} ids)")
    if refused:
        raise CLIError(
            f"--resume continues the run's saved configs; these flags would change what it "
            f"learns: {', '.join(refused)}. Drop them, or start a new run with --out DIR "
            f"(a resumed run may change only {', '.join('--' + n for n in RESUME_SAFE)})"
        )
    train_config = config_from_flags(args, TrainConfig, train_config)
    return model_config, train_config, int(meta["step"]), changed


def check_resumable(ckpt: Path, finished: bool) -> None:
    """Refuse, before anything is printed or trained, a checkpoint whose weights file is cut
    short or (for an unfinished run) has no training state to continue from."""
    from safetensors import safe_open

    from ..checkpoint import STATE_FILE, WEIGHTS_FILE, train_state_problem

    fix = "start over with --overwrite, or train a new run with --out DIR"
    try:
        with safe_open(str(ckpt / WEIGHTS_FILE), "pt"):  # reads and checks the header only
            pass
    except Exception as err:  # FileNotFoundError, or SafetensorError for a truncated file
        raise CLIError(f"--resume: {ckpt / WEIGHTS_FILE} is missing or damaged "
                       f"({str(err).splitlines()[0]}); {fix}") from None
    if finished:
        return
    if not (ckpt / STATE_FILE).is_file():
        raise CLIError(f"--resume: {ckpt} has no {STATE_FILE} (optimizer, data order and "
                       f"random state), so the run cannot continue exactly; {fix}")
    problem = train_state_problem(ckpt)  # a file cut short, or one with code in it
    if problem is not None:
        raise CLIError(f"--resume: {problem}")
