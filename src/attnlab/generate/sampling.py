"""Sampling: logits (B, V) -> next ids (B,), with the processors of transformers' generate().

The rules run in transformers' order (`GenerationMixin._get_logits_processor`): the repetition
penalty and the no-repeat n-gram ban on the model's logits (greedy decoding too), then, when
sampling, temperature, top-k, top-p, min-p and typical-p, and a draw from what is left. Each
is tested equal to transformers' processor on the same logits, ties included
(tests/test_sampling.py). `SeenIds` is the one piece of state: which ids each row has held,
kept by the token loop (`generate/__init__.py`), which owns the prompts, the cache and the
steps and hands `ban_repeated_ngrams` each row's ids so far; this module knows nothing of the
model.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def check_sampling(temperature: float, top_k: int, top_p: float, min_p: float = 0.0,
                   repetition_penalty: float = 1.0, typical_p: float = 1.0,
                   no_repeat_ngram_size: int = 0) -> None:
    """Raise ValueError naming the first setting out of range (the field's own name), in
    the ranges transformers' processors accept (1 and 0 leave them out)."""
    if not 0.0 <= temperature < math.inf:  # inf would spread NaN, not the uniform
        raise ValueError(f"temperature={temperature} must be finite and >= 0 (0 = greedy)")
    if not isinstance(top_k, int) or top_k < 0:
        raise ValueError(f"top_k={top_k!r} must be an integer >= 0 (0 = no top-k filtering)")
    if not 0.0 <= top_p <= 1.0:
        raise ValueError(f"top_p={top_p} must be in [0, 1] (1 = no nucleus filtering)")
    if not 0.0 <= min_p <= 1.0:
        raise ValueError(f"min_p={min_p} must be in [0, 1] (0 = no min-p filtering)")
    if not 0.0 < repetition_penalty < math.inf:
        raise ValueError(f"repetition_penalty={repetition_penalty} must be finite and > 0 "
                         "(1 = no penalty, above 1 discourages repeats)")
    if not 0.0 < typical_p <= 1.0:  # TypicalLogitsWarper takes (0, 1); generate() skips 1
        raise ValueError(f"typical_p={typical_p} must be in (0, 1] (1 = no typical filtering)")
    if not isinstance(no_repeat_ngram_size, int) or no_repeat_ngram_size < 0:
        raise ValueError(f"no_repeat_ngram_size={no_repeat_ngram_size!r} must be an integer "
                         ">= 0 (0 = no n-gram ban, 3 = no 3-gram twice)")


class SeenIds:
    """Which ids each row has held so far: its prompt (left padding excluded) and every id
    `add`ed since. A (B, V + 1) bool buffer written in place, so its shape and address never
    change over a generation; column V absorbs pads and ids past the vocabulary.

    input_ids (B, P), keep (B, P) True at real tokens (None: no padding), vocab_size V: the
    width of the model's logits.
    """

    def __init__(self, input_ids: Tensor, keep: Tensor | None, vocab_size: int) -> None:
        B = input_ids.shape[0]
        self.vocab_size = vocab_size
        self.seen = torch.zeros(B, vocab_size + 1, dtype=torch.bool,
                                device=input_ids.device)  # (B, V + 1)
        ids = input_ids.clamp(max=vocab_size)  # (B, P)
        if keep is not None:
            ids = ids.masked_fill(~keep, vocab_size)  # (B, P): pads land in column V
        self.seen.scatter_(1, ids, True)

    def add(self, ids: Tensor) -> None:
        """ids (B,): one new id per row."""
        self.seen.scatter_(1, ids.clamp(max=self.vocab_size)[:, None], True)

    def penalize(self, logits: Tensor, penalty: float) -> Tensor:
        """logits (B, V') with V' <= V -> logits (B, V'), each seen id's divided by `penalty`
        where positive, multiplied by it where not (transformers'
        RepetitionPenaltyLogitsProcessor, after CTRL: a penalty above 1 makes every seen id
        less likely, whatever its sign)."""
        seen = self.seen[:, :logits.shape[-1]]  # (B, V')
        penalized = torch.where(logits < 0, logits * penalty, logits / penalty)  # (B, V')
        return torch.where(seen, penalized, logits)  # (B, V')


def ban_repeated_ngrams(logits: Tensor, ids: Tensor, keep: Tensor | None, size: int) -> Tensor:
    """logits (B, V) -> logits (B, V) with -inf at every id that would complete an n-gram of
    `size` ids the row already holds: transformers' NoRepeatNGramLogitsProcessor (after
    fairseq), which matches the row's last size - 1 ids against every earlier window of
    `size` and bans each matching window's last id. ids (B, L): each row's ids so far, prompt
    and new; keep (B, L) True at real tokens (None: no padding). Unlike transformers, whose
    processor reads a left-padded row's padding as ids, a window that starts in the padding
    bans nothing, so a padded row is banned what it would be alone (as `SeenIds` skips
    padding, where transformers passes `prompt_ignore_length`)."""
    B, L = ids.shape
    if size == 0 or size > L:  # no complete n-gram yet, so nothing to ban
        return logits
    windows = ids.unfold(1, size, 1)  # (B, W, size), W = L - size + 1 windows, a view
    suffix = ids[:, L - size + 1:]  # (B, size - 1): what the next id would extend
    matches = (windows[..., :-1] == suffix[:, None, :]).all(dim=-1)  # (B, W); size 1: all
    if keep is not None:
        # left padding: a window that starts at a real token lies wholly in the real ones
        matches &= keep[:, :L - size + 1]  # (B, W)
    V = logits.shape[-1]
    # one spare column takes the windows that match nothing and ids past the logits
    banned = torch.zeros(B, V + 1, dtype=torch.bool, device=logits.device)  # (B, V + 1)
    banned.scatter_(1, torch.where(matches, windows[..., -1].clamp(max=V), V), True)
    return logits.masked_fill(banned[:, :V], float("-inf"))  # (B, V)


def _divide(logits: Tensor, temperature: float) -> Tensor:
    """logits / temperature (B, V), as transformers' TemperatureLogitsWarper divides. Where a
    temperature near 0 takes a row's largest logit past the largest float, the row is shifted
    by that max first: 0 at the max and -inf elsewhere, i.e. greedy, rather than
    inf - inf = nan (an entry lower down that overflows to -inf is harmless: its
    probability is 0 either way)."""
    # at least the smallest normal float: a float32 temperature must not round to 0
    scale = max(temperature, torch.finfo(logits.dtype).tiny)
    scores = logits / scale  # (B, V)
    if temperature >= 1.0:  # dividing cannot grow a finite logit
        return scores
    row_max = logits.amax(dim=-1, keepdim=True)  # (B, 1)
    overflow = (row_max / scale).isinf()  # (B, 1): checked on the device, no sync
    return torch.where(overflow, (logits - row_max) / scale, scores)  # (B, V)


def _top_p(scores: Tensor, order_key: Tensor, top_p: float) -> Tensor:
    """scores (B, V) with the ids outside the nucleus at -inf: transformers'
    TopPLogitsWarper. Sort ascending, accumulate the probabilities, drop every id whose
    running sum is still <= 1 - top_p, and always keep the last (most likely), so top_p=0 is
    greedy. `order_key` (B, V) orders the ids: it compares as the scores do (the logits before
    the temperature, -inf where the scores are), so torch.sort puts equal ones in the order
    transformers' torch.sort of the scores does."""
    # not stable=True: transformers' default sort leaves ties in whatever order the kernel
    # does (on x86, x86-simd-sort's quicksort), and the kept set among ties follows it
    order = torch.sort(order_key, dim=-1).indices  # (B, V) ascending
    cumulative = torch.softmax(scores.gather(-1, order), dim=-1).cumsum(dim=-1)  # (B, V)
    drop_sorted = cumulative <= (1 - top_p)  # (B, V)
    drop_sorted[..., -1] = False
    drop = drop_sorted.scatter(-1, order, drop_sorted)  # (B, V) back in id order
    return scores.masked_fill(drop, float("-inf"))  # (B, V)


def _typical(scores: Tensor, typical_p: float) -> Tensor:
    """scores (B, V) with the least typical ids at -inf: transformers' TypicalLogitsWarper
    (Meister et al. 2022, "Locally Typical Sampling"). Sort the ids by how far their
    surprisal -log p lies from the entropy, accumulate their probabilities in that order, and
    keep the ids up to the first whose running sum reaches typical_p (with any that tie its
    distance); the most typical id always stays. The same calls as transformers, in the same
    order, so equal distances sort alike (an unstable sort: `_top_p`)."""
    log_probs = torch.log_softmax(scores, dim=-1)  # (B, V)
    entropy = -(log_probs * log_probs.exp()).nansum(-1, keepdim=True)  # (B, 1); -inf*0: nan
    distance = (-log_probs - entropy).abs()  # (B, V)
    sorted_distance, order = torch.sort(distance, dim=-1)  # (B, V) ascending
    cumulative = scores.gather(-1, order).softmax(dim=-1).cumsum(dim=-1)  # (B, V)
    last = (cumulative < typical_p).sum(dim=-1, keepdim=True)  # (B, 1)
    last = last.clamp(max=scores.shape[-1] - 1)  # rounding: the sum may stay below typical_p
    drop_sorted = sorted_distance > sorted_distance.gather(-1, last)  # (B, V)
    drop_sorted[..., 0] = False
    drop = drop_sorted.scatter(-1, order, drop_sorted)  # (B, V) back in id order
    return scores.masked_fill(drop, float("-inf"))  # (B, V)


def warp_logits(logits: Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                min_p: float = 0.0, typical_p: float = 1.0) -> Tensor:
    """logits (B, V) -> scores (B, V) to sample from: divided by the temperature, then the ids
    outside the top k, the top_p nucleus, min_p and typical_p at -inf, in transformers' order
    (TemperatureLogitsWarper, TopK, TopP, MinP, Typical; each tested equal to it).

    Which ids make the top k and the order top-p sorts them in come from the logits before
    the temperature, which compare as the scores do unless a huge temperature rounds
    distinct logits into equal scores: there the most likely id still wins (top_k=1 and
    top_p=0 stay greedy), where transformers would see a tie.
    """
    check_sampling(temperature, top_k, top_p, min_p, typical_p=typical_p)
    if temperature == 0.0:
        raise ValueError("temperature=0 has no distribution (it is greedy); call sample()")
    scores = _divide(logits, temperature)  # (B, V)
    order_key = logits
    if 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]  # (B, 1)
        below = logits < kth  # (B, V): ties with the k-th stay, as in transformers
        scores = scores.masked_fill(below, float("-inf"))  # (B, V)
        order_key = logits.masked_fill(below, float("-inf"))  # (B, V)
    if top_p < 1.0:
        scores = _top_p(scores, order_key, top_p)  # (B, V)
    if min_p > 0.0:
        # after top-k and top-p, as transformers places MinPLogitsWarper: the probabilities
        # of what they left; the most likely id always stays (min_p <= 1)
        probs = torch.softmax(scores, dim=-1)  # (B, V)
        below_min = probs < min_p * probs.amax(dim=-1, keepdim=True)  # (B, V)
        scores = scores.masked_fill(below_min, float("-inf"))  # (B, V)
    if typical_p < 1.0:  # last, as transformers places TypicalLogitsWarper
        scores = _typical(scores, typical_p)  # (B, V)
    return scores


def logits_to_probs(logits: Tensor, temperature: float = 1.0, top_k: int = 0,
                    top_p: float = 1.0, min_p: float = 0.0, typical_p: float = 1.0) -> Tensor:
    """logits (B, V) -> probabilities (B, V) after temperature, top-k, top-p, min-p and
    typical-p."""
    scores = warp_logits(logits, temperature, top_k, top_p, min_p, typical_p)  # (B, V)
    return torch.softmax(scores, dim=-1)  # (B, V)


def sample(
    logits: Tensor,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
    *,
    min_p: float = 0.0,
    typical_p: float = 1.0,
) -> Tensor:
    """logits (B, V) -> next ids (B,). temperature=0 is greedy and ignores top_k, top_p,
    min_p and typical_p (transformers' do_sample=False). A repetition penalty and the
    no-repeat n-gram ban are applied before this (`SeenIds.penalize`,
    `ban_repeated_ngrams`), to greedy decoding too."""
    check_sampling(temperature, top_k, top_p, min_p, typical_p=typical_p)
    if temperature == 0.0:
        return torch.argmax(logits, dim=-1)  # (B,)
    probs = logits_to_probs(logits, temperature, top_k, top_p, min_p, typical_p)  # (B, V)
    try:
        return torch.multinomial(probs, 1, generator=generator)[:, 0]  # (B,)
    except RuntimeError:  # checked only on failure: a check per token would sync a GPU
        rows = torch.isneginf(logits).all(dim=-1).nonzero().flatten().tolist()
        if not rows:
            raise
        raise ValueError(
            f"row(s) {rows} have no id left to sample: every id is banned (-inf logits), e.g. "
            "by no_repeat_ngram_size after the row used every n-gram a small vocabulary has, "
            "or by unused_ids; lower no_repeat_ngram_size or max_new_tokens") from None
