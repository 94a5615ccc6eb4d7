"""`attnlab lens CHECKPOINT TEXT`: the logit lens, each layer's guess at the next token.

Prints, per position, the most likely next token read from the residual stream after the
embeddings and after each layer, and writes the figure (top-1 token and probability per
layer and position) and the top-k table as JSON to --out.
"""

from __future__ import annotations

import argparse

from .common import (
    CLIError,
    add_checkpoint_argument,
    add_device_flags,
    check_out,
    load_model,
    text_ids,
)
from .outputs import add_out_argument, write_json_and_figure
from .progress import Counter, blocks_shown


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "lens", help="logit lens: which layer already predicts the next token",
        description="Read TEXT's residual stream after each layer through the final norm "
        "and unembedding of CHECKPOINT.",
    )
    add_checkpoint_argument(parser)
    parser.add_argument("text", help="input text")
    parser.add_argument("--top-k", type=int, default=3,
                        help="tokens per cell in the JSON (default 3)")
    parser.add_argument("--mid", action="store_true",
                        help="also read each layer between its attention and its MLP, which "
                        "tells which of the two made a guess")
    add_out_argument(parser, "lens")
    add_device_flags(parser)
    return parser


def run(args: argparse.Namespace) -> int:
    from ..interp.lens import lens_table
    from ..model.names import absent_names
    from ..viz.heads import plot_lens
    if args.top_k < 1:
        raise CLIError(f"--top-k {args.top_k} must be >= 1")
    out = check_out(args.out)
    ckpt = load_model(args)
    model, tok = ckpt.model.eval(), ckpt.tokenizer
    ids = text_ids(tok, args.text, model.config.block_size)
    why = absent_names(model.config).get("resid_mid")
    if args.mid and why:
        raise CLIError(f"--mid reads each layer between its attention and its MLP, and this "
                       f"model has nothing there, as {why}; leave out --mid")
    # the trace, then each row's logits over the vocabulary: on a CPU, a large model over a
    # long text spends seconds on each
    with blocks_shown(model, "traced"), Counter("row", "read", delay_s=2.0) as progress:
        lens = lens_table(model, tok, ids, args.top_k, mid=args.mid, progress=progress)
    probs, names, words = lens.probs, lens.layers, lens.texts  # probs (L + 1, T, k)
    tokens = tok.token_texts(ids)
    print("position token  " + "  ".join(f"{n:>14s}" for n in names))
    for j, t in enumerate(tokens):
        cells = "  ".join(f"{words[i][j][0]!r:>8s} {float(probs[i, j, 0]):.2f}"
                          for i in range(len(names)))
        print(f"{j:8d} {t!r:6s} {cells}")
    table = {"tokens": tokens, "layers": names, "top_tokens": words,
             "top_probs": probs.tolist()}
    top1 = [[cell[0] for cell in row] for row in words]
    write_json_and_figure(out, "lens", table, plot_lens(probs[..., 0], top1, tokens, rows=names))
    return 0
