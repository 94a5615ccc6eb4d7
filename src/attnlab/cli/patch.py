"""`attnlab patch CHECKPOINT --clean TEXT --corrupt TEXT --answer A --wrong W`: activation
patching. Which heads, and which positions of the residual stream, carry the difference
between the clean and the corrupted prompt's logit difference (answer minus wrong, next
token after the prompt)? Prints the top effects, writes the heatmaps and JSON to --out.
`--method attribution` estimates every effect from one backward pass instead.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .common import (
    CLIError,
    add_checkpoint_argument,
    add_device_flags,
    check_out,
    load_model,
    text_ids,
    unescape,
)
from .outputs import add_out_argument, write_json_and_figure
from .progress import Counter

if TYPE_CHECKING:
    from torch import Tensor

    from ..interp.patching import Patching
    from ..interp.paths import PathPatching
    from ..model.config import GPTConfig
    from ..tokenizers import Tokenizer

SMALL_GAP = 0.5  # a clean - corrupted logit-difference gap below this: warn


@dataclass(frozen=True)
class Method:
    """What one --method runs and how its output names its numbers: attribution's effects
    are first-order estimates, not patches, and the printout and the figure say so."""

    function: str  # the function of attnlab.interp.patching that computes the effects
    note: str  # after "heads by effect" in the printout
    title: str  # the figure's title


METHODS = {
    "activation": Method("activation_patching", "",
                         "activation patching (1 = restores the clean run)"),
    "attribution": Method("attribution_patching", " (first-order estimates)",
                          "attribution patching: first-order estimates "
                          "(1 = restores the clean run)"),
}


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "patch", help="activation or attribution patching of heads and residual positions",
        description="Patch each head's output and each (layer, position) of the residual "
        "stream from the clean prompt into the corrupted one (--method attribution: "
        "estimate every effect to first order from one backward pass); effects are "
        "normalized to (patched - corrupted) / (clean - corrupted) of the "
        "answer-minus-wrong logit.",
    )
    add_checkpoint_argument(parser)
    parser.add_argument("--clean", required=True, help="the prompt the model gets right")
    parser.add_argument("--corrupt", required=True,
                        help="a prompt of the same token length that changes the answer")
    parser.add_argument("--answer", required=True,
                        help="the clean prompt's next token (\\n and \\t for newline and tab)")
    parser.add_argument("--wrong", required=True,
                        help="the token to compare it against (\\n and \\t as for --answer)")
    parser.add_argument("--method", choices=list(METHODS),
                        default="activation",
                        help="activation: one corrupted run per head and per (layer, "
                        "position); attribution: every effect to first order from one "
                        "backward pass (fast, approximate: confirm its top heads)")
    parser.add_argument("--by-position", action="store_true",
                        help="also each head's output at each position alone (activation: "
                        "layers x heads x tokens more runs), in patch.json and printed by "
                        "its largest effects")
    parser.add_argument("--blocks", action="store_true",
                        help="also each layer's attention output and MLP output at each "
                        "position (activation: 2 x layers x tokens more runs), in "
                        "patch.json, the figure and the printout")
    parser.add_argument("--qkv", action="store_true",
                        help="also each head's queries, keys, values and attention weights "
                        "at every position: through which input a head acts (activation: "
                        "2 x layers x (heads + key-value heads) more runs), in patch.json, "
                        "the figure and the printout")
    parser.add_argument("--paths-to", metavar="RECEIVERS",
                        help="also path patching: each earlier head's effect along its paths "
                        "to these heads' inputs alone (LAYER.HEAD[,LAYER.HEAD], e.g. 1.0,1.3), "
                        "or to the logits ('logits': through the residual stream and MLPs, "
                        "no other head); activation only, 2 runs a sender")
    parser.add_argument("--via", default="q,k,v",
                        help="with --paths-to heads: the receivers' inputs the paths end in, "
                        "of q, k, v (default all three)")
    add_out_argument(parser, "patch")
    add_device_flags(parser)
    return parser


def _one_token(tok: Tokenizer, text: str, flag: str) -> int:
    """The id of `text` as the next token of a prompt (no BOS), or a CLIError that says
    when a word needs its leading space to be one token (GPT-2, Llama: ' jumps')."""
    try:
        ids = tok.encode_continuation(text)
    except ValueError as err:
        raise CLIError(f"{flag}: {err}") from None
    if len(ids) != 1:
        spaced, hint = " " + text, ""
        try:
            if not text.startswith(" ") and len(tok.encode_continuation(spaced)) == 1:
                hint = f"; {spaced!r} (with its leading space) is one token"
        except ValueError:  # a space outside the vocabulary
            pass
        raise CLIError(f"{flag} {text!r} is {len(ids)} tokens; give exactly one token{hint}")
    return int(ids[0])


def run(args: argparse.Namespace) -> int:
    import torch

    from ..interp import patching
    from ..interp.paths import path_patching
    from ..model.names import HEAD_INPUTS, absent_names
    from ..viz.heads import plot_patching
    out = check_out(args.out)
    ckpt = load_model(args)
    model, tok = ckpt.model.eval(), ckpt.tokenizer
    clean = text_ids(tok, args.clean, model.config.block_size, "--clean")
    corrupt = text_ids(tok, args.corrupt, model.config.block_size, "--corrupt")
    if len(clean) != len(corrupt):
        raise CLIError(
            f"--clean is {len(clean)} tokens and --corrupt {len(corrupt)}: patching needs "
            "two prompts of the same token length"
        )
    args.answer, args.wrong = unescape(args.answer), unescape(args.wrong)
    answer = _one_token(tok, args.answer, "--answer")
    wrong = _one_token(tok, args.wrong, "--wrong")
    if answer == wrong:  # the logit difference is 0 in every run
        raise CLIError(f"--answer {args.answer!r} and --wrong {args.wrong!r} are the same "
                       "token, so their logit difference is 0 in every run; give two tokens")
    method = METHODS[args.method]
    receivers = _receivers(args, model.config)
    absent = absent_names(model.config)
    for name in ("attn_out", "mlp_out") if args.blocks else ():
        if name in absent:
            raise CLIError(f"--blocks patches {name}, and this model never computes it, as "
                           f"{absent[name]}; leave out --blocks")
    device = model.wte.weight.device
    pair = (torch.tensor([clean], device=device), torch.tensor([corrupt], device=device))  # (1, T)
    metric = patching.logit_diff_metric(answer, wrong)
    with Counter("run", "patched") as progress:
        # activation patching makes a corrupted run per cell: shown; attribution, one pass
        shown = {"progress": progress} if args.method == "activation" else {}
        result = getattr(patching, method.function)(
            model, *pair, metric, by_position=args.by_position, blocks=args.blocks,
            qkv=args.qkv, **shown)
    print(f"logit difference {args.answer!r} - {args.wrong!r}: clean {result.clean:.3f}, "
          f"corrupted {result.corrupted:.3f}")
    gap = abs(result.clean - result.corrupted)
    if gap < SMALL_GAP:
        print(f"warning: the clean and corrupted runs differ by only {gap:.3f} in logit "
              "difference, so the effects (ratios to it) are noisy and may fall far outside "
              "[0, 1]; choose prompts and answers the model tells apart", file=sys.stderr)
    tokens = tok.token_texts(clean)
    _print_effects(result, method, model.config.n_kv_heads < model.config.n_head)
    paths = None
    if args.paths_to is not None:
        with Counter("sender", "patched along its paths") as progress:
            paths = path_patching(model, *pair, metric, receivers,
                                  via=args.via.split(",") if receivers else None,
                                  progress=progress)
        print(f"{_paths_title(paths)}: senders by effect: {_top(paths.senders)}")
    record = {"clean": args.clean, "corrupt": args.corrupt,
              "answer": {"text": args.answer, "id": answer},
              "wrong": {"text": args.wrong, "id": wrong}, "method": args.method,
              **result.to_dict(), "tokens": tokens,
              **({"paths": paths.to_dict()} if paths is not None else {})}
    inputs = {name: getattr(result, name) for name in HEAD_INPUTS
              if getattr(result, name) is not None}
    if paths is not None:  # NaN (drawn hatched): no path from a head that late
        inputs[_paths_title(paths)] = paths.senders
    figure = plot_patching(result.heads, result.resid, tokens, title=method.title,
                           attn_out=result.attn_out, mlp_out=result.mlp_out, inputs=inputs)
    write_json_and_figure(out, "patch", record, figure)
    return 0


def _print_effects(result: Patching, method: Method, grouped: bool) -> None:
    """The five largest head effects (through each input, with --qkv; at one position, with
    --by-position), then every residual (and block output) grid row by row."""
    from ..model.names import HEAD_INPUTS

    print(f"heads by effect{method.note}: {_top(result.heads)}")
    for name, what in HEAD_INPUTS.items():
        grid = getattr(result, name)
        if grid is not None:  # keys and values of a grouped model: per key-value head
            shared = " (key-value heads)" if grouped and name in ("k", "v") else ""
            print(f"  through {what}{shared}: {_top(grid)}")
    if result.heads_by_position is not None:
        print(f"heads at one position: {_top(result.heads_by_position)}")
    grids = {"residual entering": result.resid, "attention output of": result.attn_out,
             "MLP output of": result.mlp_out}
    for what, rows in grids.items():
        for layer, effects in enumerate(rows.tolist() if rows is not None else []):
            print(f"{what} layer {layer}: " + " ".join(map(_signed, effects)))


def _top(grid: Tensor) -> str:
    """The five cells of an (n_layer, heads) or (n_layer, heads, T) grid largest in size:
    "layer.head effect" or "layer.head@position effect"; NaN cells (no path) left out."""
    cells = itertools.product(*(range(n) for n in grid.shape))
    ranked = sorted(((abs(e), e, cell) for e, cell in zip(grid.flatten().tolist(), cells,
                                                          strict=True) if e == e),
                    reverse=True)  # largest either way: a head may work against the answer
    return ", ".join(f"{cell[0]}.{cell[1]}{''.join(f'@{p}' for p in cell[2:])} {_signed(e)}"
                     for _, e, cell in ranked[:5])


def _signed(effect: float) -> str:
    """+0.25; +0.00 for what rounds to zero either side (not -0.00)."""
    return f"{round(effect, 2) + 0.0:+.2f}"


def _receivers(args: argparse.Namespace, config: GPTConfig) -> list[tuple[int, int]] | None:
    """--paths-to's receivers, checked before any run (None: the logits, or no --paths-to)."""
    from ..interp.edits import parse_heads
    from ..interp.paths import check_receivers, check_via
    if args.paths_to is None:
        if args.via != "q,k,v":
            raise CLIError(f"--via {args.via} goes with --paths-to (the receivers' inputs that "
                           "path patching patches); add --paths-to HEADS or leave out --via")
        return None
    if args.method != "activation":
        raise CLIError("--paths-to runs path patching, which patches: --method activation only")
    if args.paths_to.strip() == "logits":
        if args.via != "q,k,v":
            raise CLIError(f"--via {args.via} names receivers' inputs, and --paths-to logits "
                           "has no receivers; leave out --via")
        return None
    try:
        receivers = check_receivers(parse_heads(args.paths_to), config)
    except ValueError as err:
        raise CLIError(f"--paths-to: {err}; or 'logits'") from None
    try:
        check_via(args.via.split(","))
    except ValueError as err:
        raise CLIError(f"--via {args.via}: {err}") from None
    return receivers


def _paths_title(paths: PathPatching) -> str:
    """What the printout and the figure call a path patching's grid."""
    if paths.receivers is None:
        return "paths to the logits"
    heads = ",".join(f"{layer}.{h}" for layer, h in paths.receivers)
    return f"paths to {heads} via {','.join(paths.via)}"
