"""Head detectors: score every (layer, head) for a known attention pattern.

Definitions follow TransformerLens's `head_detector.py` (`detect_head`, "mul" error measure),
so scores are comparable with it:

    previous_token   target cell (i, i - 1)
    duplicate_token  target cells (i, j), j < i, where token j equals token i
    induction        target cells (i, j), 1 <= j <= i, where token j - 1 equals token i
                     (the duplicate pattern shifted one key to the right: attend to the
                     token *after* the earlier copy)
    first_token      target cell (i, first real token) — the "attention sink"; not one of
                     TransformerLens's names, scored the same way

and a head's score is the share of its attention that lands on target cells,
sum(A * P) / sum(A) over the (query, key) matrix of one sequence; a batch scores each row
and averages (TransformerLens scores a list of sequences the same way). `exclude_bos` and
`exclude_current_token` zero the first key column / the diagonal of A first, as there.
A row left with no attention at all (sum(A) = 0: a 2-token row with both exclusions, or a
left-padded row of one real token) has no share to score: it is left out of the mean, so it
cannot pull the batch's score toward 0; a head none of whose rows has attention left scores
NaN (TransformerLens's 0 / 0 for that row).

Padded rows (left padding, or right padding as many Hugging Face tokenizers make it):
patterns are built over each row's real tokens only, so a pad never counts as a target
(even where a pad id equals a real token), and pad queries add nothing to either sum (a
right pad's query attends to the real tokens before it, so its weights are zeroed first).
The standard probe (`standard_probe`) is random token sequences repeated twice, on which
an induction head scores near 1; a model trained on a task (`attnlab train`'s copy task) is
better probed with the task's own examples (`task_probe`), the input it learned to copy in.

`head_summaries` describes every head without a pattern to match: the means over a text's
real query rows of the trace's per-head summaries (`model/summaries.py`: entropy, weight on
the first token, distance back, largest weight), computed without a (T, T) matrix, so a
long text costs what the forward does. Pad rows are left out of those means too.

This module scores; which heads to ablate is the caller's (`edits.ablate`), drawing is
`viz/heads.py`'s.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import Tensor

from ..model.gpt import require_eval
from ..model.runtime import wide
from ..model.trace import EditSource, Trace

#: Detector names, in the order tables list them.
DETECTORS = ("previous_token", "duplicate_token", "induction", "first_token")
#: The summaries `head_summaries` averages over query rows, and what each mean says. Not
#: attn_received: each row's weights sum to 1, so its mean over the keys is the same in every
#: head (rows / keys); what it says is in its values, key by key.
SUMMARY_MEANS = {
    "attn_entropy": "entropy (nats)",
    "attn_sink": "weight on the first token",
    "attn_distance": "distance back (tokens)",
    "attn_max": "largest weight",
    # a model with learned attention sinks alone (gpt-oss's); absent elsewhere, so skipped
    "attn_learned_sink": "weight on the learned sink",
}
#: The summaries that are shares of a row's weight: the overviews colour them on 0..1, the
#: others on 0..their grid's largest value.
SHARE_SUMMARIES = ("attn_sink", "attn_max", "attn_learned_sink")


def repeated_tokens(
    vocab_size: int, length: int, batch: int = 8, *, seed: int = 0, low: int = 0
) -> Tensor:
    """(batch, 2 * length) ids: `length` random ids in [low, vocab_size), then the same again."""
    if length < 2 or vocab_size - low < 2:
        raise ValueError(
            f"a repeated-token probe needs length >= 2 and >= 2 ids, got length={length}, "
            f"ids [{low}, {vocab_size})"
        )
    gen = torch.Generator().manual_seed(seed)
    half = torch.randint(low, vocab_size, (batch, length), generator=gen)  # (B, L)
    return torch.cat([half, half], dim=1)  # (B, 2L)


def standard_probe(config: Any, seed: int = 0) -> Tensor:
    """(8, 2L) ids: the probe `detect_heads` scores on when given no ids, 8 random sequences
    of L = min(block_size // 2, 64) ids of the model's vocabulary `config` holds, each
    repeated (twice L fits the context; 64 keeps a long context's probe quick)."""
    return repeated_tokens(config.vocab_size, min(config.block_size // 2, 64), seed=seed)


def task_probe(dataset: Any, n: int = 16, *, seed: int = 0) -> Tensor:
    """(n, L) ids of n task examples (`data.TaskDataset`), prompt and answer, as a model
    trained on the task reads them (the last answer token is only ever a target). On the
    copy task each row is a random sequence, a bar and the sequence again: the repeated
    sequence the induction detector looks for, in the format the model learned."""
    gen = torch.Generator().manual_seed(seed)
    tok = dataset.tokenizer
    rows = [tok.encode(p + a)[:-1] for p, a in (dataset.sample(gen) for _ in range(n))]
    return torch.tensor(rows)  # (n, L)


def detection_pattern(kind: str, ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
    """ids (B, T) -> (B, T, T) float 0/1 target cells of detector `kind` (rows: queries)."""
    if kind not in DETECTORS:
        raise ValueError(f"unknown detector {kind!r}; known detectors: {list(DETECTORS)}")
    if ids.dim() != 2:
        raise ValueError(f"ids must be (B, T), got shape {tuple(ids.shape)}")
    T = ids.shape[1]
    real = (torch.ones_like(ids, dtype=torch.bool) if attention_mask is None
            else attention_mask.to(ids.device).bool())  # (B, T)
    both_real = real[:, :, None] & real[:, None, :]  # (B, T, T): query and key are tokens
    query = torch.arange(T, device=ids.device)[:, None]  # (T, 1)
    key = torch.arange(T, device=ids.device)[None, :]  # (1, T)
    if kind == "previous_token":
        target = (key == query - 1) & both_real  # (B, T, T)
    elif kind == "first_token":
        first = real.int().argmax(-1)  # (B,): the first real column, whatever the padding
        target = (key[None] == first[:, None, None]) & both_real  # (B, T, T)
    else:
        same = (ids[:, :, None] == ids[:, None, :]) & both_real  # (B, T, T)
        duplicate = same & (key < query)  # (B, T, T): earlier copies of the query's token
        if kind == "duplicate_token":
            target = duplicate
        else:  # induction: the key after an earlier copy; column 0 has no key before it
            target = torch.zeros_like(duplicate)
            target[:, :, 1:] = duplicate[:, :, :-1]
            target &= both_real
    return target.float()


def head_scores(
    attn_weights: Tensor,
    pattern: Tensor,
    attention_mask: Tensor | None = None,
    *,
    exclude_bos: bool = False,
    exclude_current_token: bool = False,
) -> Tensor:
    """attn_weights (B, nh, T, T) and pattern (B, T, T) -> (nh,) mean over rows of
    sum(A * P) / sum(A) (TransformerLens's "mul" score), over the rows with 2 or more real
    tokens and sum(A) > 0 after the exclusions only; NaN for a head with no such row. A row of
    one real token relates no query to an earlier key: alone it is refused (detect_heads)."""
    if attn_weights.dim() != 4 or attn_weights.shape[-1] != attn_weights.shape[-2]:
        raise ValueError(
            f"attn_weights must be (B, nh, T, T) from a run without a cache, got "
            f"{tuple(attn_weights.shape)}"
        )
    A = attn_weights.to(wide(attn_weights.dtype))  # a float64 model's scores stay float64
    B, nh, T, _ = A.shape
    tokens = torch.full((B,), T, device=A.device)  # (B,): real tokens per row
    if attention_mask is not None:  # pad queries score nothing (right pads attend to tokens)
        A = A * attention_mask.to(A.device).bool()[:, None, :, None]  # (B, nh, T, T)
        tokens = attention_mask.to(A.device).bool().sum(-1)  # (B,)
    if exclude_bos:
        first = torch.zeros(B, T, dtype=torch.long, device=A.device)
        if attention_mask is not None:  # the first real column, whatever the padding
            first = attention_mask.to(A.device).int().argmax(-1, keepdim=True).expand(B, T)
        # out of place: A may still be the caller's tensor (float() of float32 copies nothing)
        A = A.scatter(-1, first[:, None, :, None].expand(B, nh, T, 1), 0.0)  # (B, nh, T, T)
    if exclude_current_token:
        A = A * (1 - torch.eye(T, device=A.device))  # (B, nh, T, T)
    on_target = (A * pattern[:, None]).sum(dim=(-2, -1))  # (B, nh)
    total = A.sum(dim=(-2, -1))  # (B, nh)
    scored = (total > 0) & (tokens >= 2)[:, None]  # (B, nh): rows with something to score
    share = on_target / total.clamp(min=torch.finfo(A.dtype).tiny)  # (B, nh)
    return (share * scored).sum(0) / scored.sum(0)  # (nh,): 0 / 0 = NaN where none is left


@torch.no_grad()
def detect_heads(
    model: Any,
    ids: Tensor | None = None,
    attention_mask: Tensor | None = None,
    *,
    detectors: str | Iterable[str] = DETECTORS,
    exclude_bos: bool = False,
    exclude_current_token: bool = False,
    seed: int = 0,
    edits: EditSource | None = None,
) -> dict[str, Tensor]:
    """Per detector, an (n_layer, nh) tensor of scores on `ids` (B, T), or, when ids is None,
    on the standard probe (`standard_probe`: 8 random sequences, each repeated).
    edits: score the heads of the model so edited (`interp.edits`: an ablation, say)."""
    detectors = (detectors,) if isinstance(detectors, str) else tuple(detectors)
    unknown = sorted(set(detectors) - set(DETECTORS))
    if unknown:
        raise ValueError(f"unknown detectors {unknown}; known detectors: {list(DETECTORS)}")
    require_eval(model, "the head scores")
    if ids is None:
        ids = standard_probe(model.config, seed)
    device = model.wte.weight.device  # the caller's ids may be on the host
    ids = ids.to(device)
    attention_mask = None if attention_mask is None else attention_mask.to(device)
    if ids.dim() == 2 and ids.shape[1] < 2:  # a score relates a query to an earlier key
        raise ValueError(f"detect_heads needs 2 or more tokens per row, got ids of shape "
                         f"{tuple(ids.shape)}; pass longer ids, or none for the standard probe")
    trace = Trace(names=["attn_weights"]).run(model, ids, attention_mask, edits=edits)
    n_layer = model.config.n_layer
    weights = [trace.get("attn_weights", layer) for layer in range(n_layer)]  # (B, nh, T, T)
    scores = {}
    for kind in detectors:
        pattern = detection_pattern(kind, ids, attention_mask)  # (B, T, T)
        scores[kind] = torch.stack([
            head_scores(w, pattern, attention_mask, exclude_bos=exclude_bos,
                        exclude_current_token=exclude_current_token)
            for w in weights
        ])  # (n_layer, nh)
    return scores


def rank_heads(scores: Tensor, descending: bool = True) -> list[tuple[int, int]]:
    """(n_layer, nh) scores -> every (layer, head), best first (ties: lower layer, head;
    NaN scores, heads with nothing to score, last)."""
    flat = scores.flatten().tolist()
    nh = scores.shape[1]
    order = sorted(range(len(flat)), key=lambda i: (
        math.isnan(flat[i]), 0.0 if math.isnan(flat[i]) else -flat[i] if descending
        else flat[i], i))
    return [(i // nh, i % nh) for i in order]


def summary_means(trace: Trace, layers: Sequence[int], attention_mask: Tensor | None = None,
                  row: int | None = None) -> dict[str, Tensor]:
    """Per summary of `SUMMARY_MEANS` the trace holds for `layers`, a (len(layers), heads)
    tensor: its mean over the batch's real query rows (attention_mask (B, S), default the
    padding the trace's pass ran with; pad rows left out; NaN when no row is real), or over
    batch row `row`'s alone (negative counts from the end; the mask may then be the row's
    own (S,))."""
    if attention_mask is None:
        attention_mask = trace.attention_mask
    means = {}
    for name in SUMMARY_MEANS:
        if not layers or not all((layer, name) in trace for layer in layers):
            continue
        stack = torch.stack([trace.get(name, layer) for layer in layers])
        stack = stack.to(wide(stack.dtype))  # float32, or a float64 model's float64
        B, T = stack.shape[1], stack.shape[-1]  # (layers, B, heads, T)
        real = real_queries(attention_mask, B, T, row).to(stack)  # (B or 1, T)
        if row is not None:
            stack = stack[:, row % B, None]  # (layers, 1, heads, T)
        total = (stack * real[None, :, None, :]).sum(dim=(1, 3))  # (layers, heads)
        means[name] = total / real.sum()  # (layers, heads)
    return means


def real_queries(attention_mask: Tensor | None, B: int, T: int, row: int | None = None
                 ) -> Tensor:
    """1 for each real query of a trace's B rows of T queries, 0 for a pad's: the last T
    columns of attention_mask (B, S >= T; None: all real), (B, T); or batch row `row`'s,
    (1, T), from the (B, S) mask or the row's own (S,). A ValueError names a row out of
    range or a mask of another shape."""
    if row is not None and not -B <= row < B:
        raise ValueError(f"row={row} out of range for a batch of {B} rows (0 to {B - 1}, or "
                         "negative from the end)")
    n = B if row is None else 1
    if attention_mask is None:
        return torch.ones(n, T)
    mask = torch.as_tensor(attention_mask)
    if mask.dim() == 2 and mask.shape[0] == B and row is not None:
        mask = mask[row, None]  # (1, S)
    elif mask.dim() == 1 and row is not None:
        mask = mask[None]  # (1, S): the row's own
    if mask.dim() != 2 or mask.shape[0] != n or mask.shape[1] < T:
        raise ValueError(f"attention_mask of shape {tuple(torch.as_tensor(attention_mask).shape)}"
                         f" for a trace of {B} row{'s' * (B != 1)} of {T} queries; pass the "
                         f"(B, S) = ({B}, >= {T}) mask its model ran with")
    return mask[:, -T:]


@torch.no_grad()
def head_summaries(model: Any, ids: Tensor, attention_mask: Tensor | None = None, *,
                   edits: EditSource | None = None) -> dict[str, Tensor]:
    """Per summary of `SUMMARY_MEANS`, an (n_layer, nh) tensor of its mean over the real
    query rows of `ids` (B, T): traced in tiles, never a (T, T) matrix (`summary_means`).
    edits: of the model so edited."""
    require_eval(model, "the head summaries")
    trace = Trace(names=list(SUMMARY_MEANS)).run(model, ids, attention_mask, edits=edits)
    return summary_means(trace, range(model.config.n_layer), attention_mask)


#: The most extreme heads `extreme_heads` lists: (summary, largest first, what it says).
EXTREMES = (
    ("attn_sink", True, "most weight on the first token"),
    ("attn_learned_sink", True, "most weight on the learned sink"),
    ("attn_entropy", False, "lowest entropy (nats): most peaked"),
    ("attn_distance", True, "longest distance back (tokens)"),
    ("attn_distance", False, "shortest distance back (tokens)"),
)


def extreme_heads(means: dict[str, Tensor], k: int = 3
                  ) -> list[tuple[str, list[tuple[int, int, float]]]]:
    """Per row of `EXTREMES` whose summary `means` holds ((n_layer, nh) each): its
    description and the top k (layer index, head index, mean), NaN heads never listed."""
    rows = []
    for name, largest, label in EXTREMES:
        if name not in means:
            continue
        values = means[name].cpu()  # one copy from a GPU, not a read per head
        ranked = [(la, h) for la, h in rank_heads(values, descending=largest)
                  if not math.isnan(float(values[la, h]))]
        rows.append((label, [(la, h, float(values[la, h])) for la, h in ranked[:k]]))
    return rows
