"""`attnlab heads CHECKPOINT`: score every head with the detectors, rank them, and for a task
model, ablate the top induction heads to see whether they do the task.

The probe: TEXT when given; for a model trained on a task (`attnlab train` without
arguments: copy), the task's own examples; otherwise (a text model, or a Hugging Face
directory, which records no task: said in a note) random token sequences repeated twice.
Prints a table (one row per head, best induction score first) and writes a layer x head
heatmap of each detector and the scores as JSON to --out.
"""

from __future__ import annotations

import argparse
from typing import Any

from .common import (
    CLIError,
    add_checkpoint_argument,
    add_device_flags,
    check_out,
    count,
    load_model,
    text_ids,
)
from .outputs import add_out_argument, write_json_and_figure
from .progress import blocks_shown

MIN_INDUCTION = 0.1  # a best induction score below this: no induction heads to ablate


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "heads",
        help="find previous-token, duplicate-token, induction and first-token heads",
        description="Score every head of CHECKPOINT with TransformerLens's head detectors, "
        "rank them, and on a task model ablate the top induction heads.",
    )
    add_checkpoint_argument(parser)
    parser.add_argument("text", nargs="?", default=None,
                        help="probe text (default: the task's examples, or repeated tokens)")
    add_out_argument(parser, "heads")
    parser.add_argument("--seed", type=int, default=0, help="seed of the probe (default 0)")
    parser.add_argument("--no-ablation", dest="ablation", action="store_false",
                        help="skip the accuracy check with heads ablated (task models)")
    add_device_flags(parser)
    return parser


def run(args: argparse.Namespace) -> int:
    from ..interp.heads import DETECTORS, detect_heads, rank_heads
    from ..train.data import TASKS, TaskDataset, load_dataset
    from ..viz.heads import plot_head_scores
    out = check_out(args.out)
    ckpt = load_model(args)
    model = ckpt.model.eval()
    name = ckpt.meta.get("dataset")
    dataset = load_dataset(name) if name in TASKS else None
    ids, probe = _probe(args, ckpt, dataset)
    with blocks_shown(model, "traced"):  # a large model on a CPU: a minute
        scores = detect_heads(model, ids.to(model.wte.weight.device))
    ranked = rank_heads(scores["induction"])
    print(f"probe: {probe}")
    if args.text is None and name is None:  # a task model's copy ranks differently on these
        print(f"note:  {args.checkpoint} records no data it was trained on (a Hugging Face "
              "directory keeps none), so it is probed with random repeats; a task model's "
              "attnlab checkpoint is probed with its task's examples, or pass TEXT")
    print("head   " + "  ".join(f"{k:>15s}" for k in DETECTORS))
    for layer, head in ranked:
        cells = "  ".join(f"{float(scores[k][layer, head]):15.3f}" for k in DETECTORS)
        print(f"{layer}.{head:<4d} {cells}")
    report: dict[str, Any] = {"probe": probe, "scores": {k: v.tolist() for k, v in scores.items()},
                              "induction_ranking": [f"{la}.{h}" for la, h in ranked]}
    if isinstance(dataset, TaskDataset) and args.ablation:
        report["ablation"] = _ablation(model, dataset, scores["induction"], ranked)
    write_json_and_figure(out, "heads", report,
                          plot_head_scores(scores, f"head detector scores on {probe}"))
    return 0


def _probe(args: argparse.Namespace, ckpt: Any, dataset: Any) -> tuple[Any, str]:
    """(ids, what they are): TEXT, the task's examples, or the standard probe."""
    import torch

    from ..interp.heads import standard_probe, task_probe

    c = ckpt.model.config
    if args.text is not None:
        ids = text_ids(ckpt.tokenizer, args.text, c.block_size, "the probe text")
        if len(ids) < 2:  # a score relates a query to an earlier key
            raise CLIError(f"the probe text {args.text!r} is {count(len(ids), 'token')}; head "
                           "detectors need at least 2 tokens (a query and a key before it): "
                           "give a longer text, or none for the standard probe")
        return torch.tensor([ids]), f"the text ({len(ids)} tokens)"
    if dataset is not None:
        examples = task_probe(dataset, seed=args.seed)
        return examples, f"{examples.shape[0]} examples of the {dataset.name} task"
    repeats = standard_probe(c, args.seed)
    return repeats, (f"{repeats.shape[0]} random sequences of {repeats.shape[1] // 2} tokens, "
                     "each repeated")


def _ablation(model: Any, dataset: Any, induction: Any, ranked: list[tuple[int, int]]
              ) -> dict[str, Any]:
    """The causal check: held-out accuracy intact, without the top induction heads (every
    head scoring at least half the best), and without as many of the lowest-scoring."""
    from ..interp.edits import ablate
    from ..train.recipes import answer_accuracy

    best = float(induction.max())
    if not best >= MIN_INDUCTION:  # nan too
        print(f"no induction heads on this probe (best score {best:.3f} < {MIN_INDUCTION}): "
              "ablation skipped; a probe with repeated text shows them")
        return {"skipped": f"best induction score {best:.3f} < {MIN_INDUCTION}"}
    top = [h for h in ranked if float(induction[h]) >= best / 2]
    low = [h for h in reversed(ranked) if h not in top][:len(top)]  # never one of the top
    base, _ = answer_accuracy(model, dataset, n=256, seed=1)
    no_top, rows = answer_accuracy(model, dataset, n=256, seed=1, edits=ablate(top))
    no_low = answer_accuracy(model, dataset, n=256, seed=1, edits=ablate(low))[0] if low \
        else None  # every head is a top one

    def names(heads: list[tuple[int, int]]) -> str:
        return ",".join(f"{la}.{h}" for la, h in heads)

    print(f"held-out answer accuracy (256 examples): intact {base:.1%}")
    print(f"  top induction heads {names(top)} ablated (zero):  {no_top:.1%}"
          f"   e.g. {rows[0][0]}{rows[0][2]} (expected {rows[0][1]})")
    if no_low is not None:
        print(f"  lowest-scoring heads {names(low)} ablated (zero): {no_low:.1%}")
    return {"intact": base, "top_heads": names(top), "top_ablated": no_top,
            "low_heads": names(low), "low_ablated": no_low}
