"""`attnlab demo hello | animals | averaging`: the seeds' experiments, run, checked and drawn.

hello and animals train seed 002's one-layer model with `recipes.seed_experiment`'s recipe
(or reuse the checkpoint a previous run left in --out) and draw seed 002's figures before
and after training: embeddings, q/k/v and weighted values, raw -> masked -> scaled
attention. animals then checks, sentence by sentence, that the row of " a"/" an" puts its
largest weight on the noun, and prints what it finds either way. averaging runs seed 004's
three forms of the running mean and draws their weight matrix.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

from .common import CLIError, add_device_flags, check_out, device_of

DEMOS = {
    "hello": 'seed 002: one attention layer learns that " World" follows "Hello"',
    "animals": 'seed 002: "The X is a" -> Y; does " a" attend to the noun X?',
    "averaging": "seed 004: loops, tril matmul and masked softmax give the same running mean",
}


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    listing = "\n".join(f"  {name:<10} {desc}" for name, desc in DEMOS.items())
    parser = subparsers.add_parser(
        "demo",
        help="run a seed experiment (hello, animals, averaging) and draw it",
        description="Train and draw the seeds' experiments.",
        epilog=f"demos:\n{listing}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("name", choices=list(DEMOS), metavar="NAME",
                        help=f"one of {', '.join(DEMOS)}")
    parser.add_argument("--out", help="where figures and the checkpoint go "
                        "(default: attnlab-demo/NAME, or NAME-seedS with --seed S)")
    parser.add_argument("--retrain", action="store_true",
                        help="train again even if --out holds a checkpoint of this recipe")
    parser.add_argument("--format", default="png", metavar="png,svg,pdf",
                        help="figure formats, comma-separated (default: png)")
    parser.add_argument("--seed", type=int, default=None,
                        help="train with this seed instead of the recipe's (hello, animals)")
    parser.add_argument("--no-figures", dest="figures", action="store_false",
                        help="train and check only; draw nothing")
    add_device_flags(parser, "bfloat16: train under autocast, as attnlab train --dtype does "
                     "(hello, animals; default float32)", dtypes=("float32", "bfloat16"),
                     force=False)
    return parser


FIGURE_FORMATS = ("png", "svg", "pdf")  # viz.save.FORMATS, without importing matplotlib


def run(args: argparse.Namespace) -> int:
    # another seed or dtype is another model: its own folder, not the recipe's retrained
    name = args.name + ("" if args.seed is None else f"-seed{args.seed}") + (
        "" if args.dtype == "float32" else f"-{args.dtype}")
    out = check_out(Path(args.out) if args.out else Path("attnlab-demo") / name)
    formats = [f.strip() for f in args.format.split(",") if f.strip()] if args.figures else []
    bad = [f for f in formats if f not in FIGURE_FORMATS]
    if bad or (args.figures and not formats):  # before training, not after it
        raise CLIError(f"--format {args.format}: choose from {', '.join(FIGURE_FORMATS)} "
                       "(comma-separated)")
    if args.seed is not None and args.name == "averaging":
        raise CLIError("--seed applies to hello and animals, which train; averaging trains "
                       "nothing and draws fixed inputs (torch.manual_seed(1337))")
    if args.dtype != "float32" and args.name == "averaging":
        raise CLIError(f"--dtype {args.dtype} applies to hello and animals, which train; "
                       "averaging compares three float32 forms of the running mean")
    from ..model.runtime import one_thread

    device = device_of(args)
    # these models have a few hundred parameters: one thread runs them several times faster
    # than two (docs/performance.md#one-thread-for-tiny-models)
    with one_thread():
        if args.name == "averaging":
            return _averaging(out, formats, device)
        return _seed_002(args.name, out, formats, args.retrain, args.seed, device, args.dtype)


# --------------------------------------------------------------------- seed 002


def _seed_002(
    name: str, out: Path, formats: list[str], retrain: bool, seed: int | None, device: Any,
    dtype: str = "float32",
) -> int:
    import torch

    from ..model.gpt import GPT
    from ..train.data import SentenceDataset
    from ..train.recipes import seed_experiment

    model_config, train_config, dataset = seed_experiment(name)
    if not isinstance(dataset, SentenceDataset):
        raise CLIError(f"seed_experiment({name!r}) gave {dataset.name!r}, not seed 002's sentences")
    if seed is not None:
        train_config = dataclasses.replace(train_config, seed=seed)
    train_config = dataclasses.replace(train_config, device=str(device), dtype=dtype)
    torch.manual_seed(train_config.seed)  # the untrained model train() starts from
    before = GPT(model_config).to(device).eval()
    after, how = _trained(out, model_config, train_config, dataset, retrain)
    tc = train_config
    print(f"model    seed-minimal: 1 layer, 1 head, n_embd {model_config.n_embd}, "
          f"{model_config.vocab_size} words, {after.num_params(non_embedding=False)} parameters")
    print(f"train    {tc.optimizer} lr {tc.lr:g}, {tc.max_iters} steps, seed {tc.seed}"
          f"{'' if tc.dtype == 'float32' else ', ' + tc.dtype + ' autocast'}: {how}")

    tok = dataset.tokenizer
    ok = _report_hello(after, tok) if name == "hello" else _report_animals(after, dataset)
    if not ok:
        print(f"note     the check did not hold everywhere for this run (seed {tc.seed}); "
              "the figures show what this model does")
    if not formats:
        return 0
    x = dataset.ids[:, :-1].to(device)  # (N, L-1): every sentence but its last word
    pick = 1 if name == "animals" else 0  # "The human is a": the sentence seed 002 draws
    tokens = [tok.decode([int(i)]) for i in x[pick]]
    written: list[Path] = []
    for phase, model in (("before", before), ("after", after)):
        written += _draw_phase(model, x, pick, tokens, out, phase, formats)
    if name == "animals":
        written += _draw_sentences(after, dataset, out, formats)
    names = [p.name for p in written]
    if (out / "loss.png").exists():  # drawn by train(), always as png
        names.append("loss.png" if formats == ["png"] else "loss.png (train's curve, png)")
    print(f"figures  {out}/: {', '.join(names)}")
    return 0


def _trained(out: Path, model_config: Any, train_config: Any, dataset: Any,
             retrain: bool) -> tuple[Any, str]:
    """The trained model: a checkpoint in out/ckpt of this exact recipe, or a new run."""
    from ..load import load_checkpoint
    from ..train.loop import train

    ckpt = out / "ckpt"

    def recipe(config: dict[str, Any]) -> dict[str, Any]:  # the same on any device
        return {k: v for k, v in config.items() if k != "device"}

    if ckpt.exists() and not retrain:
        try:
            saved = load_checkpoint(ckpt, map_location=train_config.device)
        except (ValueError, FileNotFoundError, OSError) as err:
            raise CLIError(f"{ckpt} is not a readable checkpoint ({err}); pass --retrain "
                           "or another --out") from err
        if saved.model.config == model_config and recipe(
                saved.meta.get("train_config") or {}) == recipe(dataclasses.asdict(train_config)):
            return saved.model, f"reused {ckpt} (--retrain to train again)"
        raise CLIError(f"{ckpt} holds a model of another recipe (another demo's, or an "
                       "earlier version's); pass --retrain to replace it, or another --out")
    result = train(model_config, train_config, dataset, out)
    loss = [r["loss"] for r in result.history if "loss" in r][-1]
    return result.model, f"trained in {result.seconds:.1f} s, final loss {loss:.4f}"


def _trace(model: Any, x: Any) -> Any:
    import torch

    from ..model.trace import Trace

    trace = Trace()
    with torch.no_grad():
        logits = model(x, trace=trace).logits  # (N, T, V)
    return trace, logits


def _draw_phase(model: Any, x: Any, pick: int, tokens: list[str], out: Path, phase: str,
                formats: list[str]) -> list[Path]:
    from .. import viz

    trace, _ = _trace(model, x)
    text = "".join(tokens)

    def head(name: str) -> Any:
        return trace.get(name, 0)[pick, 0]  # (T, hs) or (T, T): the picked sentence

    files = viz.save_figure(viz.plot_embeddings(
        trace.get("tok_emb")[pick], trace.get("pos_emb")[pick], trace.get("emb")[pick], tokens,
        title=f"{text!r}: embeddings {phase} training"), out / f"{phase}_embeddings", formats)
    files += viz.save_figure(viz.plot_qkv(
        head("q"), head("k"), head("v"), tokens, context=head("context"),
        title=f"{text!r}: queries, keys, values {phase} training"), out / f"{phase}_qkv",
        formats)
    files += viz.save_figure(viz.plot_attention_steps(
        head("attn_scores"), head("masked_scores"), head("attn_weights"), tokens,
        scale=model.config.score_scale, title=f"{text!r}: attention {phase} training"),
        out / f"{phase}_attention", formats)
    return files


def _report_hello(model: Any, tok: Any) -> bool:
    import torch

    ids = tok.encode("Hello")
    with torch.no_grad():
        logits = model(torch.tensor([ids], device=model.wte.weight.device)).logits[0, -1]  # (V,)
    got = tok.decode([int(logits.argmax())])
    ok = got == " World"
    prob = float(torch.softmax(logits, -1).max())
    print(f"check    'Hello' -> {got!r} (p={prob:.3f})  {'✓' if ok else '✗ expected  World'}")
    return ok


def noun_rows(model: Any, dataset: Any) -> list[dict[str, Any]]:
    """Per sentence: the predicted last word, and the weights of the " a"/" an" row."""
    trace, logits = _trace(model, dataset.ids[:, :-1].to(model.wte.weight.device))
    weights = trace.get("attn_weights", 0)[:, 0, -1]  # (N, S): the row of the word before last
    tok = dataset.tokenizer
    rows = []
    for ids, w, pred in zip(dataset.ids, weights, logits[:, -1].argmax(-1), strict=True):
        rows.append({
            "prompt": tok.decode(ids[:-1].tolist()),
            "noun": tok.decode([int(ids[1])]),
            "expected": tok.decode([int(ids[-1])]),
            "predicted": tok.decode([int(pred)]),
            "weights": [float(v) for v in w],
            "largest": tok.decode([int(ids[int(w.argmax())])]),
            "noun_largest": int(w.argmax()) == 1,
        })
    return rows


def _report_animals(model: Any, dataset: Any) -> bool:
    rows = noun_rows(model, dataset)
    print('check    in the row of " a"/" an", is the noun (the second word) the largest '
          "weight? and the last word?")
    for r in rows:
        weights = " ".join(f"{w:.2f}" for w in r["weights"])
        noun = "✓" if r["noun_largest"] else f"✗ (largest: {r['largest']!r})"
        word = "✓" if r["predicted"] == r["expected"] else f"✗ (expected {r['expected']!r})"
        print(f"         {r['prompt']!r:<24} weights [{weights}]  noun {noun:<22} "
              f"-> {r['predicted']!r} {word}")
    nouns = sum(r["noun_largest"] for r in rows)
    words = sum(r["predicted"] == r["expected"] for r in rows)
    print(f"found    noun has the largest weight in {nouns}/{len(rows)} rows; "
          f"last word right in {words}/{len(rows)} sentences")
    return nouns == words == len(rows)


def _draw_sentences(model: Any, dataset: Any, out: Path, formats: list[str]) -> list[Path]:
    from .. import viz

    trace, _ = _trace(model, dataset.ids[:, :-1].to(model.wte.weight.device))
    weights = trace.get("attn_weights", 0)[:, 0]  # (N, T, T)
    tok = dataset.tokenizer
    token_lists = [[tok.decode([int(i)]) for i in ids[:-1]] for ids in dataset.ids]
    titles = [repr("".join(t)) for t in token_lists]
    T = weights.shape[-1]
    fig = viz.plot_panels(weights, token_lists, titles, highlight=(T - 1, 1),
                          title='attention weights after training (outlined: the row of " a", '
                          "column of the noun)")
    return viz.save_figure(fig, out / "after_sentences", formats)


# --------------------------------------------------------------------- seed 004


def _averaging(out: Path, formats: list[str], device: Any) -> int:
    import torch

    from .. import viz
    from ..demos.averaging import AVERAGING_FORMS
    from ..model.masks import causal_mask

    torch.manual_seed(1337)
    B, T, C = 4, 8, 2  # seed 004's sizes
    x = torch.randn(B, T, C).to(device)  # drawn on the host: the same numbers on any device
    results = {name: form(x) for name, form in AVERAGING_FORMS.items()}  # each (B, T, C)
    names = list(results)
    print(f"input    x: (B={B}, T={T}, C={C}) from torch.manual_seed(1337), as in seed 004")
    agree = True
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            diff = float((results[a] - results[b]).abs().max())
            close = torch.allclose(results[a], results[b], atol=1e-6)
            agree &= close
            print(f"check    {a:<12} vs {b:<12} max |diff| {diff:.1e}  "
                  f"{'✓' if close else '✗'}")
    # the weights of the softmax form: averaging the identity returns the matrix itself
    weights = AVERAGING_FORMS["softmax"](torch.eye(T, device=device)[None])[0]  # (T, T)
    zeros = torch.zeros(T, T, device=device)
    masked = zeros.masked_fill(~causal_mask(T, T, device=device), float("-inf"))  # (T, T)
    tokens = [f"t{i}" for i in range(T)]
    print("weights  softmax of the masked zero matrix (row t averages tokens 0..t):")
    for row in weights:
        print("         " + " ".join(f"{float(w):.3f}" for w in row))
    print(f"found    the three forms {'agree' if agree else 'DISAGREE'}")
    if not formats:
        return 0
    files = viz.save_figure(viz.plot_attention_steps(
        zeros, masked, weights, tokens,
        title="seed 004: causal attention with equal scores is the running mean",
        names=("scores: all equal (zeros)", "masked: -inf above the diagonal",
               "softmax: row t averages tokens 0..t")),
        out / "averaging_weights", formats)
    print(f"figures  {out}/: {', '.join(p.name for p in files)}")
    return 0
