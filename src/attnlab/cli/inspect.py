"""`attnlab inspect CHECKPOINT "text" --out DIR`: draw what attention does to a text.

Runs the model once with a `Trace` that keeps only what the chosen figures need, writes
the figures (viz.py) and `attention.json` (tokens and the attention weights of the chosen
layers and heads) to DIR. `--format html` writes `attention.html` instead of figures: the
interactive view of `attnlab.show()` as one file that opens offline (show.py). How the files
reach DIR (a hidden stage, attention.json written a few rows at a time, earlier runs' files
tidied) is inspect_files.py's.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from .common import (
    CLIError,
    add_checkpoint_argument,
    add_device_flags,
    check_out,
    count,
    cpu_memory_errors,
    device_of,
    interrupts_held,
    load_opened,
    open_model,
    out_of_memory,
    text_ids,
)
from .inspect_files import AttentionRecord, list_files, move_in
from .outputs import staging
from .progress import Counter, blocks_shown

#: what -> (trace names it needs, description for --help)
WHAT: dict[str, tuple[tuple[str, ...], str]] = {
    "weights": (("attn_weights",), "attention weights softmax(masked * scale), one per head"),
    "scores": (("attn_scores",), "raw scores q @ k^T, one per head"),
    "masked": (("masked_scores",), "scores with -inf where a query may not attend"),
    "steps": (("attn_scores", "masked_scores", "attn_weights"),
              "raw, masked and softmax side by side (seed 002)"),
    "qkv": (("q", "k", "v", "context"), "queries, keys, values and weighted values"),
    "embeddings": (("tok_emb", "pos_emb", "emb"), "token, position and summed embeddings"),
    "row": (("attn_weights",), "one query's weights as bars over the tokens (--query)"),
    "grid": (("attn_weights",), "every chosen layer x head in one figure"),
    "experts": (("expert_weights",), "a mixture of experts' routing: each token's experts "
                "and their weights, a panel per layer"),
}
DEFAULT_WHAT = "grid,weights,row"


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    kinds = "\n".join(f"  {name:<11} {desc}" for name, (_, desc) in WHAT.items())
    parser = subparsers.add_parser(
        "inspect",
        help="draw a text's attention (heatmaps, layer x head grid) and save it as JSON",
        description="Run CHECKPOINT on TEXT, draw its attention into --out and write "
        "attention.json (tokens, token ids, weights per layer and head).",
        epilog=f"--what takes a comma-separated list of:\n{kinds}\n  all         every one",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_checkpoint_argument(parser)
    parser.add_argument("text", help="the text to run (at most the model's block_size tokens)")
    parser.add_argument("--out", default="inspect", help="output directory (default: inspect)")
    parser.add_argument("--layer", type=_int_list, default=None, metavar="L[,L...]",
                        help="layers to draw (default: all)")
    parser.add_argument("--head", type=_int_list, default=None, metavar="H[,H...]",
                        help="heads to draw (default: all)")
    parser.add_argument("--what", default=DEFAULT_WHAT, metavar="KINDS",
                        help=f"figures to draw, comma-separated (default: {DEFAULT_WHAT}); "
                        "see below; --format html alone draws none")
    parser.add_argument("--summary", action="store_true",
                        help="instead of weights, the per-head summaries (entropy, weight on "
                        "the first token, distance back, largest weight; no T x T, so long "
                        "texts too): a layer x head grid per summary (summary.png, or "
                        "summary.html with --format html), summary.json and a table of the "
                        "most extreme heads")
    parser.add_argument("--query", type=int, default=None,
                        help="token index for --what row (default: -1, the last token), and "
                        "the token the html page opens pinned on (default: none; hover)")
    parser.add_argument("--format", default="png", metavar="png,svg,pdf,html",
                        help="output formats, comma-separated (default: png); html writes "
                        "attention.html, one self-contained interactive page")
    add_device_flags(parser)
    return parser


def _int_list(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers like 0 or 0,2, got {text!r}") from None


def parse_what(text: str) -> list[str]:
    kinds = [k.strip() for k in text.split(",") if k.strip()]
    if "all" in kinds:
        return list(WHAT)
    unknown = [k for k in kinds if k not in WHAT]
    if unknown or not kinds:
        raise CLIError(f"--what {text!r}: unknown {unknown or 'empty'}; choose from "
                       f"{', '.join(WHAT)}, all")
    return kinds


def _figure_bar(n: int, formats: list[str], grid_heads: int = 0) -> Any:
    """A `Counter` of the figures drawn, when there are enough to wait for (24 files or
    more: docs/performance.md#figures), after one line on stderr saying so: a bar on a
    terminal, a line every few seconds in a log (which had nothing for minutes).
    grid_heads: the heads of a grid drawn first, named in the line (one figure, the
    longest: 512 heads of a 1B model take seconds before the bar's first step)."""
    many = n * len(formats) >= 24
    if many:
        grid = f" (first the grid of {grid_heads} heads)" if grid_heads > 1 else ""
        print(f"drawing  {n} figures as {', '.join(formats)}{grid}", file=sys.stderr,
              flush=True)
    return Counter("figure", "drew", delay_s=0.0) if many else None


def _pick(given: list[int] | None, n: int, flag: str) -> list[int]:
    if given is None:
        return list(range(n))
    bad = [i for i in given if not 0 <= i < n]
    if bad:
        raise CLIError(f"{flag} {bad} out of range: the model has {n} ({flag[2:]}s 0..{n - 1})")
    return sorted(set(given))


def run(args: argparse.Namespace) -> int:
    import torch

    from ..interp.heads import SUMMARY_MEANS
    from ..model.trace import Trace

    kinds = parse_what(args.what)
    if args.summary and args.what != DEFAULT_WHAT:
        raise CLIError(f"--summary draws the summaries instead of --what {args.what}; drop "
                       "one of them")
    if args.summary and args.query is not None:
        raise CLIError(f"--summary averages over every query row; --query {args.query} picks "
                       "one for --what row; drop one of them")
    formats, page = _formats(args.format)
    if page and not formats:
        if args.what != DEFAULT_WHAT:  # it was ignored without a word
            raise CLIError(f"--what {args.what} picks figures, and --format {args.format} "
                           "writes the page alone; add a figure format (--format html,png) or "
                           "drop --what")
        kinds = []  # only the page (and attention.json)
    out = check_out(args.out)
    opened = open_model(args)  # config and tokenizer: the text is sized before the load
    c = opened.config
    if c.n_experts is None and "experts" in kinds:
        if args.what != "all":
            raise CLIError(f"--what {args.what}: experts draws a mixture of experts' routing, "
                           "and this model has one dense MLP a block (n_experts unset)")
        kinds.remove("experts")
    layers = _pick(args.layer, c.n_layer, "--layer")
    heads = _pick(args.head, c.n_head, "--head")
    ids = text_ids(opened.tokenizer, args.text, c.block_size)
    T = len(ids)
    query = _query(args.query, T)
    if args.summary:  # the summaries alone: no attention.json of weights, no T x T
        ckpt = load_opened(args, opened, inspect_memory(args, c, T, SUMMARY_MEANS, layers,
                                                        heads, written=False))
        return _run_summary(args, ckpt.model, ckpt.tokenizer, ids, layers, heads,
                            str(ckpt.path), out)

    names = {"attn_weights"} | {n for k in kinds for n in WHAT[k][0]}
    if page:
        names |= {"attn_scores", "masked_scores"}  # the steps view and exact masks
    # bars of one query's weights need that row alone: no (T, T) weights, so long texts too
    rows = [query] if kinds == ["row"] and not page else None
    ckpt = load_opened(args, opened, inspect_memory(args, c, T, names, layers, heads, rows))
    model, tok = ckpt.model, ckpt.tokenizer
    tokens = tok.token_texts(ids)
    idx = torch.tensor([ids], device=model.wte.weight.device)  # (1, T)
    try:
        with cpu_memory_errors(), blocks_shown(model, "traced"):
            trace = Trace(layers=layers, heads=heads, names=names, rows=rows).run(model, idx)
    except torch.OutOfMemoryError as err:
        raise out_of_memory("inspect", err, idx.device) from None

    head_of = _head_getter(trace, c, heads)
    with staging(out, "inspect") as stage:
        written = _draw(kinds, formats, stage, trace, c, layers, heads, head_of, tokens, query,
                        args.text)
        record = AttentionRecord(
            {**({} if rows is None else {"query_rows": rows}), "checkpoint": str(ckpt.path),
             "text": args.text, "tokens": tokens, "token_ids": ids, "layers": layers,
             "heads": heads},
            layers, heads, lambda la, h: head_of("attn_weights", la, h))
        if page:
            from ..viewer.notebook import show

            # pinned only when asked: a pinned token holds the page still under the pointer
            view = show(trace, tok, ids=ids, layer=layers[0], head=heads[0],
                        query=None if args.query is None else query,
                        scale=c.score_scale, title=f"attnlab inspect · {args.text[:40]}")
            written.append(view.save(stage / "attention.html"))
        with Counter("head", "wrote attention.json", delay_s=2.0) as progress:
            written, stale = move_in(out, stage, record, [p.name for p in written], progress)

    print(f"text     {count(T, 'token')}: {' '.join(repr(t) for t in tokens[:16])}"
          + (" …" if T > 16 else ""))
    print(f"traced   layers {_ranges(layers)}, heads {_ranges(heads)}: "
          f"{', '.join(sorted(names))} ({trace.size_text()})")
    list_files(out, written, stale)
    return 0


#: host bytes per traced weight for what attention.json and the figures hold of them (the
#: grid's image of every head, one head's working copies), 5-9 measured, and whatever the
#: text for matplotlib and the figure being drawn (its import, a canvas and its copies:
#: ~110 MB measured with one head): docs/performance.md#inspect-memory
OUTPUT_BYTES_PER_WEIGHT = 16
FIGURE_BYTES = 128 * 2**20
INSPECT_FIX = ("a shorter text, fewer layers or heads (--layer, --head), --what row (one "
               "query's weights), or --summary (per-head summaries, no T x T)")


def inspect_memory(args: argparse.Namespace, config: Any, T: int, names: Iterable[str],
                   layers: list[int], heads: list[int], rows: list[int] | None = None,
                   written: bool = True) -> list[Any]:
    """What inspect holds beside the model, for the load's fit check: the trace (on the
    device) and, on the CPU, what attention.json and the figures hold of its weights. On a
    GPU those copies (and the weights' own copy on the host) are checked here, against the
    host's memory, before the load."""
    from ..model.memory import Use, trace_use

    R = T if rows is None else len(rows)  # the query rows kept of each head's (T, T)
    uses = [trace_use(config, T, sorted(names), layers=len(layers), heads=len(heads),
                      rows=None if rows is None else R, fix=INSPECT_FIX, device=device_of(args))]
    weights = len(layers) * len(heads) * R * T
    copies = f"attention.json's and the figures' copies of its {weights:,} weights"
    output = OUTPUT_BYTES_PER_WEIGHT * weights + FIGURE_BYTES
    if written and device_of(args).type == "cpu":
        uses.append(Use(copies, nbytes=output, fix=INSPECT_FIX))
    elif written and not getattr(args, "force", False):  # float32 on the host, then copies
        _check_host(f"{copies} (and the weights themselves) on this machine",
                    4 * weights + output)
    return uses


def _check_host(what: str, nbytes: int) -> None:
    """A CLIError unless this machine has `nbytes` free for `what`."""
    from ..model.memory import available_bytes, gb

    free = available_bytes("cpu")
    if free is not None and nbytes > free:
        raise CLIError(f"inspect needs {gb(nbytes)} for {what} but this machine has "
                       f"{gb(free)} free; to hold less: {INSPECT_FIX}; --force tries anyway")


def _run_summary(args: argparse.Namespace, model: Any, tok: Any, ids: list[int],
                 layers: list[int], heads: list[int], checkpoint: str, out: Path) -> int:
    """`inspect --summary`: the chosen heads' summaries, means over the text's query rows,
    as a grid figure (or page), summary.json and a printed table of the extreme heads."""
    import torch

    from ..interp.heads import SUMMARY_MEANS, extreme_heads, summary_means
    from ..model.trace import Trace

    formats, page = _formats(args.format)
    with blocks_shown(model, "traced"):
        trace = Trace(layers=layers, heads=heads, names=list(SUMMARY_MEANS)).run(
            model, torch.tensor([ids], device=model.wte.weight.device))
    means = {name: value.cpu() for name, value in summary_means(trace, layers).items()}
    title = f"per-head summaries of {args.text[:40]!r}" + ("…" if len(args.text) > 40 else "")
    # the extreme heads, named by the model's layer and head indices
    extremes = [(label, [(layers[la], heads[h], v) for la, h, v in top])
                for label, top in extreme_heads(means)]
    record = {"checkpoint": checkpoint, "text": args.text, "tokens": tok.token_texts(ids),
              "layers": layers, "heads": heads,
              "means": {name: value.tolist() for name, value in means.items()},
              "extremes": [{"what": label, "heads": [[la, h, v] for la, h, v in top]}
                           for label, top in extremes]}
    names: list[str] = []
    with staging(out, "inspect") as stage:  # the set whole, or none of it
        if formats:
            from .. import viz

            fig = viz.plot_head_summaries(means, SUMMARY_MEANS, title, layers=layers,
                                          heads=heads)
            names += [p.name for p in viz.save_figure(fig, stage / "summary", formats)]
        if page:
            from ..viewer.notebook import show

            names.append(show(trace, tok, ids=ids, summary=True, title=title).save(
                stage / "summary.html").name)
        (stage / "summary.json").write_text(json.dumps(record))
        names.append("summary.json")  # moved last: the record says the set is whole
        with interrupts_held():  # a few renames: the set whole before a Ctrl-C lands
            for name in names:
                os.replace(stage / name, out / name)
    written = [out / name for name in names]
    print(f"text     {count(len(ids), 'token')}")
    print(f"traced   layers {_ranges(layers)}, heads {_ranges(heads)}: "
          f"{', '.join(SUMMARY_MEANS)} ({trace.size_text()}, no T x T)")
    print(f"heads    the most extreme (layer.head mean over the {count(len(ids), 'query row')})")
    for label, top in extremes:
        print(f"  {label:<36s}" + "  ".join(f"{f'{la}.{h}':>5s} {v:.3f}" for la, h, v in top))
    list_files(out, written, set())
    return 0


def _query(given: int | None, T: int) -> int:
    """--query as an index in 0..T-1 (default -1: the last token)."""
    asked = -1 if given is None else given
    query = asked + T if asked < 0 else asked
    if not 0 <= query < T:
        raise CLIError(f"--query {asked} out of range for {T} tokens (use 0..{T - 1} or -1)")
    return query


def _formats(text: str) -> tuple[list[str], bool]:
    """--format's figure formats, and whether it asks for the html page."""
    from ..viz.save import FORMATS

    formats = [f.strip() for f in text.split(",") if f.strip()]
    page = "html" in formats
    formats = [f for f in formats if f != "html"]
    bad = [f for f in formats if f not in FORMATS]
    if bad or not (formats or page):
        raise CLIError(f"--format {text}: choose from {', '.join(FORMATS)}, html "
                       "(comma-separated)")
    return formats, page


def _head_getter(trace: Any, config: Any, heads: list[int]) -> Callable[[str, int, int], Any]:
    """head_of(name, layer, h): query head h's traced (T, S) or (T, hs) tensor; for k / v,
    that of the key/value head it reads."""
    group = config.n_head // config.n_kv_heads  # query heads per key/value head (GQA)
    kv_kept = sorted({h // group for h in heads})  # the k/v heads the trace kept

    def head_of(name: str, layer: int, h: int) -> Any:
        if name in ("k", "v"):
            return trace.get(name, layer)[0, kv_kept.index(h // group)]
        return trace.get(name, layer)[0, heads.index(h)]

    return head_of


def _draw(kinds: list[str], formats: list[str], out: Path, trace: Any, c: Any,
          layers: list[int], heads: list[int], head_of: Callable[[str, int, int], Any],
          tokens: list[str], query: int, text: str) -> list[Path]:
    """Draw the figures of `kinds` into `out` in `formats`: the files written."""
    import torch

    from .. import viz

    written: list[Path] = []
    group = c.n_head // c.n_kv_heads  # query heads per key/value head (GQA)
    pairs = [(la, h) for la in layers for h in heads]
    # which keys each layer's queries could see (a sliding window hides more than the
    # future): hatched in the figures, not drawn as weight 0
    may_attend = {la: trace.may_attend(la) for la in layers}  # (T, S) each
    n_figures = sum(len(pairs) if k not in ("embeddings", "grid", "experts") else 1
                    for k in kinds)
    bar = _figure_bar(n_figures, formats, len(pairs) if kinds[:1] == ["grid"] else 0)

    def save(fig: Any, stem: str, close: bool = True) -> None:
        written.extend(viz.save_figure(fig, out / stem, formats, close=close))
        if bar is not None:
            bar(len(written) // len(formats), n_figures)

    for kind in kinds:
        if kind == "embeddings":
            tok_emb = trace.get("tok_emb")[0]  # (T, C)
            # rotary (or no) positions add nothing to the embeddings: show that as zeros
            pos_emb = trace.get("pos_emb")[0] if (None, "pos_emb") in trace else (
                torch.zeros_like(tok_emb))
            title = "embeddings" if c.pos == "learned" else f"embeddings (pos={c.pos}: none added)"
            save(viz.plot_embeddings(tok_emb, pos_emb, trace.get("emb")[0], tokens, title=title),
                 "embeddings")
        elif kind == "experts":
            save(viz.plot_experts([trace.get("expert_weights", la)[0] for la in layers],
                                  tokens, layers, title=f"expert weights of {text[:40]!r}"),
                 "experts")
        elif kind == "grid":
            # the traced layers as they are: a stacked copy would be one more trace
            weights = [trace.get("attn_weights", la)[0] for la in layers]  # (nh, T, S) each
            shown = text if len(text) <= 40 else text[:39] + "…"
            save(viz.plot_grid(weights, tokens, layers=layers, heads=heads,
                               title=f"attention weights of {shown!r}",
                               may_attend=torch.stack([may_attend[la] for la in layers])),
                 "grid")
        else:
            fig = None  # one figure per kind, refilled head after head: its ticks built once
            for i, (la, h) in enumerate(pairs):
                fig, stem = _head_figure(kind, fig, head_of, la, h, tokens, query, c.score_scale,
                                         group, may_attend[la], c.attn_logit_softcapping,
                                         c.attn_sinks)
                save(fig, stem, close=i == len(pairs) - 1)
    if bar is not None:
        bar.close()
    # a closed figure's images (the grid's: a trace's worth) live in reference cycles until
    # a collection: free them before attention.json and the page are written
    gc.collect()
    return written


def _head_figure(kind: str, into: Any, head_of: Callable[[str, int, int], Any], la: int,
                 h: int, tokens: list[str], query: int, scale: float,
                 group: int = 1, may_attend: Any = None,
                 softcap: float | None = None, sinks: bool = False) -> tuple[Any, str]:
    """The figure of `kind` for layer `la`, head `h` (`into` refilled when given), and the
    name of its file. group: query heads per key/value head (grouped-query attention).
    may_attend: the layer's (T, S) mask, hatched in weights and masked scores (default the
    causal future). softcap, sinks: the model's attention soft cap and whether it has learned
    sinks, named in the steps' title."""
    from .. import viz

    where = f"layer {la}, head {h}"
    if kind == "weights":
        return viz.plot_attention(head_of("attn_weights", la, h), tokens, into=into,
                                  may_attend=may_attend,
                                  title=f"attention weights, {where}"), f"weights_L{la}_H{h}"
    if kind in ("scores", "masked"):
        name = "attn_scores" if kind == "scores" else "masked_scores"
        return viz.plot_attention(head_of(name, la, h), tokens, kind=kind, into=into,
                                  may_attend=None if kind == "scores" else may_attend,
                                  title=f"{WHAT[kind][1]}, {where}"), f"{kind}_L{la}_H{h}"
    if kind == "steps":
        return viz.plot_attention_steps(
            head_of("attn_scores", la, h), head_of("masked_scores", la, h),
            head_of("attn_weights", la, h), tokens, scale=scale, softcap=softcap, sinks=sinks,
            title=where,
            may_attend=may_attend, into=into,
        ), f"steps_L{la}_H{h}"
    if kind == "qkv":
        if group > 1:
            kv, first = h // group, h // group * group
            where += f" (k and v: key/value head {kv}, read by heads {first}-{first + group - 1})"
        return viz.plot_qkv(head_of("q", la, h), head_of("k", la, h), head_of("v", la, h),
                            tokens, context=head_of("context", la, h), title=where,
                            into=into), f"qkv_L{la}_H{h}"
    # row: of every row's (T, S) weights, or of a trace that kept the query's row alone
    def row(of: Any) -> Any:
        return of[0] if of.shape[0] == 1 else of[query]  # (S,)

    return viz.plot_row(row(head_of("attn_weights", la, h)), tokens, query,
                        may_attend=None if may_attend is None else row(may_attend),
                        into=into), f"row_L{la}_H{h}_q{query}"


def _ranges(values: list[int]) -> str:
    return f"{values[0]}..{values[-1]}" if values == list(range(values[0], values[-1] + 1)) \
        and len(values) > 2 else ",".join(map(str, values))
