"""What the attention viewer's API answers with, as plain data: one text's attention
weights per layer and head, a generation's token ids one at a time and the server-sent events
that carry them, head detector scores and the heads overview (per-head summaries) with a
prediction under ablation, the logit lens, a mixture of experts' routing, and sample texts
that fit a model's tokenizer and context (what the page starts from).

Nothing here knows about routes: validation, limits and locking are `state.py`'s and the
routes' (`routes/`); the model math is `model/gpt.py`'s, sampling `generate/`'s, the
captured weights `model/trace.py`'s, detectors, edits and the lens `interp/`'s.
"""

from __future__ import annotations

import base64
import contextlib
import json
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from typing import Any, Protocol

import torch
from torch import Tensor

from ..generate import stream as generate_stream
from ..interp.edits import ablate
from ..interp.heads import (
    SHARE_SUMMARIES,
    SUMMARY_MEANS,
    detect_heads,
    extreme_heads,
    head_summaries,
    rank_heads,
)
from ..interp.lens import lens_table, top_tokens
from ..model.gpt import GPT
from ..model.trace import Trace
from ..tokenizers import token_text
from ..tokenizers.token_bytes import visible_controls


class TextTokenizer(Protocol):
    """What the viewer needs from a tokenizer (`attnlab.tokenizers.core.Tokenizer` has it).

    `encode` raises ValueError for text it cannot encode; `pieces` gives one display
    string per token. Optional: `name` (shown on the page), `stop_ids` (end generation) and
    `decode_continuation` (new ids decoded after the prompt's).
    """

    @property
    def vocab_size(self) -> int: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def pieces(self, ids: Sequence[int]) -> list[str]: ...



def _triangles(weights: Tensor, below: Tensor) -> list[str]:
    """(nh, T, T) -> per head, the float32 bytes (little-endian) of the cells where `below`
    (T, T) is True, row after row, base64."""
    flat = weights.float().cpu()[:, below].numpy().astype("<f4")  # (nh, T (T + 1) / 2)
    return [base64.b64encode(head.tobytes()).decode("ascii") for head in flat]


def _rounded(t: Tensor, decimals: int) -> Any:
    """Nested lists of t rounded to `decimals`; in float64 so 0.12345 prints as 0.12345."""
    scale = 10.0**decimals
    return t.double().mul(scale).round().div(scale).tolist()


def attention_payload(
    model: GPT,
    ids: Sequence[int],
    tokenizer: TextTokenizer,
    *,
    layers: Sequence[int] | None = None,
    norms: bool = False,
    decimals: int = 5,
    encoding: str = "lists",
) -> dict[str, Any]:
    """Run `ids` once with a trace and return the JSON body of /api/attention. encoding
    "lists": each head's lower triangle as rows of numbers rounded to `decimals`;
    "float32": as one base64 string of float32 (little-endian), rows one after another
    (row i: keys 0..i): the exact weights, and faster to encode and parse, so the page asks
    for it (docs/performance.md#viewer-encoding)."""
    n_layer = model.config.n_layer
    wanted = list(range(n_layer)) if layers is None else list(dict.fromkeys(layers))
    names = ["attn_weights", "q", "k", "v"] if norms else ["attn_weights"]
    idx = torch.tensor([list(ids)], dtype=torch.long, device=model.wte.weight.device)  # (1, T)
    trace = Trace(layers=wanted, names=names).run(model, idx)  # up to the last layer asked
    T = idx.shape[1]
    below = torch.ones(T, T, dtype=torch.bool).tril()  # (T, T) keys up to the query
    future = ~below  # (T, T) keys after the query
    out_layers = []
    for layer in wanted:
        weights = trace.get("attn_weights", layer)[0]  # (nh, T, S) with S == T
        entry: dict[str, Any] = {
            "layer": layer,
            # rounded a head at a time: one tolist of every head holds the GIL (attention_json)
            "heads": _triangles(weights, below) if encoding == "float32" else [
                [row[: i + 1] for i, row in enumerate(_rounded(head, decimals))]
                for head in weights],
            "future_max": float(weights.masked_select(future.to(weights.device)).max())
            if T > 1 else 0.0,
            # query i sees keys i - window < j <= i: the page draws the others as masked
            "window": model.config.window_of(layer),
        }
        if norms:
            entry["norms"] = {
                n: _rounded(trace.get(n, layer)[0].norm(dim=-1), 4) for n in ("q", "k", "v")
            }  # (nh or nkv, T) each
        out_layers.append(entry)
    pieces = tokenizer.pieces(list(ids))
    tokens = [{"id": i, "text": p} for i, p in zip(ids, pieces, strict=True)]
    return {"tokens": tokens, "n_head": model.config.n_head, "layers": out_layers}


def attention_json(payload: dict[str, Any]) -> str:
    """`json.dumps(payload)`'s very text for an `attention_payload`, written a head at a time.
    One dumps of millions of rounded weights holds the GIL for seconds, so a server's event
    loop waits through it even with the encoding in a worker thread; between two heads' dumps
    it runs."""

    def pairs(entry: dict[str, Any], inner: str, write: Callable[[Any], str]) -> str:
        return "{" + ", ".join(
            f"{json.dumps(key)}: " + ("[" + ", ".join(map(write, value)) + "]" if key == inner
                                      else json.dumps(value))
            for key, value in entry.items()) + "}"

    return pairs(payload, "layers", lambda layer: pairs(layer, "heads", json.dumps))


def token_stream(
    model: GPT,
    ids: list[int],
    *,
    max_new_tokens: int,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    seed: int | None,
    eot_ids: Sequence[int],
    vocab_size: int,
    unused_ids: Sequence[int] = (),
    min_p: float | None = None,
    typical_p: float | None = None,
    repetition_penalty: float = 1.0,
    no_repeat_ngram_size: int = 0,
) -> Iterator[int]:
    """New token ids, one per `next()`, from `generate.stream` (KV cache, sampling, eot);
    never an id at or past vocab_size, or in unused_ids (a tokenizer's holes)."""
    idx = torch.tensor([ids], dtype=torch.long, device=model.wte.weight.device)  # (1, P)
    steps = generate_stream(
        model, idx, max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k or 0,
        top_p=1.0 if top_p is None else top_p, min_p=0.0 if min_p is None else min_p,
        typical_p=1.0 if typical_p is None else typical_p,
        repetition_penalty=repetition_penalty, no_repeat_ngram_size=no_repeat_ngram_size,
        seed=seed, eot_id=eot_ids, vocab_size=vocab_size,
        unused_ids=unused_ids,
    )
    return (int(next_ids[0]) for next_ids in steps)


def _sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


async def stream_events(
    step: Callable[[], Awaitable[int | None]],
    tokenizer: TextTokenizer,
    ids: list[int],
    stop_ids: Sequence[int],
    reason: str,
    disconnected: Callable[[], Awaitable[bool]],
) -> AsyncIterator[bytes]:
    """SSE events of one generation: `start` {prompt_ids} (so that a client that stops
    early can show the ids it got), `token` {id, text} per token, then `done` or `error`.

    `step` gives the next token id (None: no more), `disconnected` says whether the client
    left. `text` is what the new token adds to the decoded text; it is held back while the
    text ends in an incomplete character (a byte-level BPE token can be half of one).
    """
    new: list[int] = []
    sent = ""
    continuation = getattr(tokenizer, "decode_continuation", None)

    def decode() -> str:  # the new ids as they continue the prompt (keeps a leading space)
        return continuation(new, ids) if continuation else tokenizer.decode(new)

    yield _sse("start", {"prompt_ids": ids})
    try:
        while not await disconnected():
            token = await step()
            if token is None:
                break
            if token in stop_ids:
                reason = "eot"
                break
            new.append(token)
            text = decode()
            delta = "" if text.endswith("\ufffd") else text[len(sent):]
            sent += delta
            yield _sse("token", {"id": token, "text": delta})
        else:
            return  # the client left: nobody to tell
        text = decode()
        if text[len(sent):]:
            yield _sse("token", {"id": None, "text": text[len(sent):]})
        yield _sse("done", {"ids": ids + new, "new_tokens": len(new), "reason": reason,
                            "text": text})
    except ValueError as err:
        yield _sse("error", {"error": str(err)})


def _mean(x: float) -> float | None:
    """A summary's mean as the overview writes it: 4 decimals, None (null) for NaN (a row
    with no real query)."""
    return round(x, 4) if math.isfinite(x) else None


def overview_payload(means: dict[str, Tensor], layers: Sequence[int], heads: Sequence[int],
                     *, rows: int, padded: bool = False) -> dict[str, Any]:
    """The heads overview as `web/overview.js` draws it, in the page's heads panel (a part of
    /api/heads's answer) and in `show(..., summary=True)`: per summary of `means` ((layers,
    heads) each, `interp.heads.summary_means`) its means, its label and whether it is a
    share of a row's weight (drawn on 0..1); the layers' and heads' labels; the most extreme
    heads (`interp.heads.extreme_heads`, named by those labels) and a note saying what the
    means are over: `rows` query rows, some left out as pads where `padded`."""
    layers, heads = list(layers), list(heads)
    over = f"{rows} query row{'s' * (rows != 1)}" + (" (pads left out)" if padded else "")
    return {
        "summaries": {name: [[_mean(x) for x in row] for row in m.tolist()]
                      for name, m in means.items()},
        "summary_labels": {name: SUMMARY_MEANS[name] for name in means},
        "summary_shares": [name for name in SHARE_SUMMARIES if name in means],
        "summary_layers": layers,
        "summary_heads": heads,
        "summary_extremes": [
            {"what": what, "heads": [[layers[la], heads[h], _mean(v)] for la, h, v in top]}
            for what, top in extreme_heads(means)],
        "summary_note": f"means over the {over}, computed in tiles without the T × T weights",
    }


def heads_payload(model: Any, tokenizer: Any, ids: list[int], ablated: list[tuple[int, int]],
                  k: int = 5) -> dict[str, Any]:
    """Detector scores on `ids`, the heads overview (`overview_payload` of each per-head
    summary's mean over the query rows, `head_summaries`) and the next-token top-k intact
    and with `ablated` heads, each token's text written as `attention_payload`'s tokens
    (control characters visible)."""
    idx = torch.tensor([ids], device=model.wte.weight.device)  # (1, T)
    with torch.no_grad():
        scores = detect_heads(model, idx)
        means = head_summaries(model, idx)
        intact = model(idx, last_logits_only=True).logits[0, -1]  # (V,)
        edited = model(idx, edits=ablate(ablated), last_logits_only=True).logits[0, -1]  # (V,)

    def top(logits: Tensor) -> list[dict[str, Any]]:
        probs, top_ids = top_tokens(logits[: tokenizer.vocab_size], k)
        return [{"id": i, "text": visible_controls(token_text(tokenizer, i)), "prob": round(p, 4)}
                for p, i in zip(probs.tolist(), top_ids.tolist(), strict=True)]

    return {
        "scores": {kind: [[round(float(x), 4) for x in row] for row in s.tolist()]
                   for kind, s in scores.items()},
        "induction_ranking": [[la, h] for la, h in rank_heads(scores["induction"])],
        **overview_payload(means, range(model.config.n_layer), range(model.config.n_head),
                           rows=len(ids)),
        "ablated": [[la, h] for la, h in ablated],
        "prediction": {"intact": top(intact), "ablated": top(edited)},
    }


def lens_payload(model: Any, tokenizer: Any, ids: list[int], k: int = 3) -> dict[str, Any]:
    """Top-k next tokens read after the embeddings and after each layer, at every position;
    their texts written as `attention_payload`'s tokens (control characters visible)."""
    table = lens_table(model, tokenizer, ids, k)
    return {
        "ids": ids,  # the tokens read: the page shows the lens only while it shows these
        "layers": table.layers,
        "top": [[[{"text": visible_controls(text), "prob": round(float(p), 4)}
                  for p, text in zip(ps, texts, strict=True)]
                 for ps, texts in zip(p_row, t_row, strict=True)]
                for p_row, t_row in zip(table.probs.tolist(), table.texts, strict=True)],
    }

def _significant(t: Tensor, digits: int) -> Any:
    """Nested lists of t (L, T, E) to `digits` significant digits, in float64 as `_rounded`;
    0 stays an int 0 (short in JSON). Significant digits, not decimals: a chosen expert's
    small weight stays above 0, where decimals would round it to a skipped expert's 0."""
    x = t.double()  # (L, T, E)
    scale = torch.pow(10.0, digits - 1 - x.abs().clamp_min(1e-300).log10().floor())  # (L, T, E)
    return [[[w if w else 0 for w in row] for row in layer]
            for layer in x.mul(scale).round().div(scale).tolist()]


def routing_payload(weights: Sequence[Tensor], layers: Sequence[int], tokens: Sequence[str],
                    *, first: int = 0, real: Tensor | None = None) -> dict[str, Any]:
    """A mixture of experts' routing of one row as `web/routing.js` draws it, in the page's
    routing panel (/api/routing's answer) and in show()'s routing tab: per layer of `layers`
    its `weights` (T, E) (a trace's "expert_weights" of the row: each expert's weight in each
    token's output, 0 where the token skipped it) to 4 significant digits, and each expert's
    share of the tokens (the fraction that chose it, 4 decimals: a layer's shares add up to
    the experts a token chooses, top_k); `tokens` label the T rows, the first one token
    #`first` (queries after a KV cache); real (T,) bool leaves pads out of the shares."""
    stacked = torch.stack([w.detach().float().cpu() for w in weights])  # (L, T, E)
    T, E = stacked.shape[1:]
    if len(tokens) != T:
        raise ValueError(f"{len(tokens)} token labels for {T} routed tokens")
    keep = torch.ones(T, dtype=torch.bool) if real is None else real.cpu().bool()  # (T,)
    chosen = stacked != 0  # (L, T, E) the experts each token goes through (moe.py)
    n = int(keep.sum())
    shares = chosen[:, keep].sum(dim=1) / max(n, 1)  # (L, E)
    over = f"{n} token{'s' * (n != 1)}" + (" (pads left out)" if n < T else "")
    return {
        "layers": list(layers), "tokens": list(tokens), "first": first, "experts": E,
        "top_k": int(chosen.sum(dim=-1).max()) if T else 0,
        "weights": _significant(stacked, 4), "shares": _rounded(shares, 4),
        "note": f"shares of the {over} that chose each expert; weights to 4 significant "
                "digits",
    }


def routing_answer(model: GPT, ids: Sequence[int], tokenizer: TextTokenizer,
                   layers: Sequence[int] | None = None) -> dict[str, Any]:
    """The JSON body of /api/routing: `routing_payload` of `ids` run once with a trace of
    the routing (up to the last layer asked, its router), each token's text written as
    `attention_payload`'s tokens, and the ids. Default layers: every one with a mixture (not
    the dense ones, `GPTConfig.has_mixture`)."""
    c = model.config
    wanted = [i for i in range(c.n_layer) if c.has_mixture(i)] if layers is None else list(
        dict.fromkeys(layers))
    idx = torch.tensor([list(ids)], dtype=torch.long, device=model.wte.weight.device)  # (1, T)
    trace = Trace(layers=wanted, names=["expert_weights"]).run(model, idx)
    weights = [trace.get("expert_weights", layer)[0] for layer in wanted]  # (T, E) each
    return {"ids": list(ids),
            **routing_payload(weights, wanted, tokenizer.pieces(list(ids)))}


# what the page shows first when the model can read it (English text, char or BPE tokenizer)
DEFAULT_TEXT = "The cat sat on the mat. The dog sat on the log."
DEFAULT_PROMPT = "The cat"


def sample_texts(
    tokenizer: TextTokenizer, block_size: int, meta: dict[str, Any] | None = None
) -> dict[str, str]:
    """{"text", "prompt"} the viewer starts from, both inside the tokenizer's vocabulary and
    the model's context: a built-in task's own example for a model trained on one (the copy
    task's "qhdkwzpa|qhdkwzp", 16 tokens in a 16-token context), the page's English sentence
    where the tokenizer can encode it (cut to block_size tokens), else a run of the
    vocabulary's own printable tokens. The prompt leaves room to generate."""
    from ..train.data import TASKS, TaskDataset

    dataset = (meta or {}).get("dataset")
    if dataset in TASKS:
        prompt, answer = TaskDataset(dataset).sample(torch.Generator().manual_seed(0))
        with contextlib.suppress(ValueError):  # another tokenizer: fall through
            ids = tokenizer.encode(prompt + answer)[:block_size]
            if len(tokenizer.encode(prompt)) < block_size:
                return {"text": tokenizer.decode(ids), "prompt": prompt}
    try:
        ids = list(tokenizer.encode(DEFAULT_TEXT))
        prompt_ids = list(tokenizer.encode(DEFAULT_PROMPT))
    except ValueError:  # a character outside the vocabulary
        unused: frozenset[int] = getattr(tokenizer, "unused_ids", frozenset())  # no decode
        ids = [i for i in range(tokenizer.vocab_size)
               if i not in unused and _printable(tokenizer.decode([i]))]
        prompt_ids = ids[: max(1, min(8, block_size // 2))]
    if len(prompt_ids) >= block_size:
        prompt_ids = prompt_ids[: max(1, block_size // 2)]
    return {"text": tokenizer.decode(ids[:block_size]), "prompt": tokenizer.decode(prompt_ids)}


def _printable(piece: str) -> bool:
    return bool(piece.strip()) and piece.isprintable() and "\ufffd" not in piece
