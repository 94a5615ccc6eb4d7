"""Causal and padding masks as boolean "may attend" tensors: True where a query may look at a
key (the seeds' `tril` then `masked_fill(-inf)`, kept as booleans until the scores need
them). The causal mask treats the queries as the *last* T of S positions (the trim
`tril(S, S)[-T:, -S:]` of the full mask), which is what a KV cache needs, and is built from
two `arange`s so a decode step never allocates an S x S matrix. `build_mask` joins causal,
window and padding masks into the `Mask` that `attention.attend` reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor


def causal_mask(
    q_len: int,
    k_len: int,
    device: torch.device | str | None = None,
    *,
    window: int | None = None,
    rows: list[int] | None = None,
) -> Tensor:
    """(T, S) bool: query i (absolute position k_len - q_len + i) may attend key j iff j <= it
    (and, with a sliding `window`, iff it - window < j: the last `window` keys, itself included).
    rows: those queries' rows alone (indices into the T), (len(rows), S).

    Equals `torch.tril(torch.ones(k_len, k_len, dtype=bool))[-q_len:, -k_len:]` without
    allocating the k_len x k_len matrix.
    """
    if q_len < 1 or k_len < q_len:
        raise ValueError(
            f"causal_mask needs 1 <= q_len <= k_len, got q_len={q_len}, k_len={k_len}; "
            "queries are the last q_len of k_len positions, so a cache must hold the new keys too"
        )
    query_pos = torch.arange(k_len - q_len, k_len, device=device)  # (T,)
    if rows is not None:
        query_pos = query_pos[torch.tensor(rows, device=device)]  # (rows,)
    key_pos = torch.arange(k_len, device=device)  # (S,)
    may_attend = key_pos[None, :] <= query_pos[:, None]  # (T, S)
    if window is not None:
        may_attend &= key_pos[None, :] > query_pos[:, None] - window  # (T, S)
    return may_attend


def padding_mask(attention_mask: Tensor) -> Tensor:
    """(B, S) with 1 = real token, 0 = pad  ->  (B, 1, 1, S) bool "may attend" over keys."""
    if attention_mask.dim() != 2:
        raise ValueError(
            f"attention_mask must be (B, S) with 1 for tokens and 0 for padding, "
            f"got shape {tuple(attention_mask.shape)}"
        )
    return attention_mask.bool()[:, None, None, :]  # (B, 1, 1, S)


def padding_of_row(attention_mask: Tensor, row: int, S: int, of: str = "ids") -> Tensor:
    """attention_mask (B, S) or (S,) -> (S,): the 1/0 padding of one batch row, of a model's
    ids or of a trace's keys (`of`, for the error)."""
    pad = torch.as_tensor(attention_mask)
    pad = pad[row] if pad.dim() == 2 else pad  # (S,)
    if pad.dim() != 1 or pad.shape[0] != S:
        raise ValueError(f"attention_mask of shape {tuple(torch.as_tensor(attention_mask).shape)}"
                         f" for {S} {of}; pass the (B, {S}) mask of the batch these {of} "
                         "come from")
    return pad


@dataclass(frozen=True)
class Mask:
    """One combined "may attend" mask, built once per forward and shared by all layers.

    may_attend:   (B or 1, 1, T, S) bool, or None when every query may see every key.
    square_causal: True when may_attend is exactly the T == S causal mask, so the fused
                  path can use SDPA's `is_causal=True` kernel instead of a mask tensor.
    empty_rows:   (B, 1, T, 1) bool, True for queries with no key to attend to (left-pad
                  positions), or None when there are none possible. Their output is zero.
    padding:      (B, S) bool, True for real tokens (the attention mask), or None without
                  one: which key is a row's first real one and which queries are pads, for
                  the summaries (`summaries.py`).
    causal:       how `build_mask` made may_attend, for kernels that rebuild it from indices
                  (`summary_kernels.py`): True, the causal mask with cached keys (and `window`)
                  and the padding; False, the padding alone; None, a mask of any other shape.
    window:       the sliding window in may_attend (with causal), or None.
    cross:        True for cross-attention: the queries come from another sequence, not the
                  last T of the S keys, so no query is a key (no pad query, no distance).
    spans:        the traced path's key spans per block of queries
                  (`traced_attention.key_spans`), worked out by the first layer that needs
                  them and read by the others.
    """

    may_attend: Tensor | None
    square_causal: bool = False
    empty_rows: Tensor | None = None
    padding: Tensor | None = None
    causal: bool | None = None
    window: int | None = None
    cross: bool = False
    spans: dict[tuple[int, int, int], list[tuple[int, int, int]]] = field(
        default_factory=dict, init=False, repr=False, compare=False)


def build_mask(
    q_len: int,
    k_len: int,
    attention_mask: Tensor | None = None,
    *,
    causal: bool = True,
    device: torch.device | str | None = None,
    window: int | None = None,
    cross: bool = False,
) -> Mask:
    """Combine causal structure and a (B, k_len) padding mask into one `Mask`.

    window: sliding-window attention (with `causal`): a query at slot i sees keys at slots
    i - window < j <= i. Slots are absolute cache positions; within a left-padded row the
    real tokens are contiguous, so slot distance is position distance.
    cross: the keys come from another sequence (cross-attention, never causal).
    """
    if cross and causal:
        raise ValueError("cross-attention (cross=True) has no causal mask: its queries are "
                         "not among the keys; pass causal=False")
    if attention_mask is not None and attention_mask.shape[-1] != k_len:
        raise ValueError(
            f"attention_mask covers {attention_mask.shape[-1]} keys but attention sees "
            f"k_len={k_len}; with a KV cache pass the mask for cached + new tokens "
            f"(shape (B, {k_len}))"
        )
    may_attend: Tensor | None = None
    if window is not None and (not causal or window < 1):
        raise ValueError(f"a sliding window={window} needs causal attention and window >= 1")
    windowed = window is not None and window < k_len  # else it hides no key
    window = window if windowed else None
    # A single query is the last position, so its causal row is all True: leaving it out lets
    # a decode step without padding run SDPA with no mask at all. (k_len >= 1: with no key,
    # causal_mask says what is wrong.)
    if causal and (windowed or not (q_len == 1 and k_len >= 1)):
        may_attend = causal_mask(q_len, k_len, device, window=window)[None, None]  # (1, 1, T, S)
    if attention_mask is None:
        return Mask(may_attend, square_causal=causal and q_len == k_len and not windowed,
                    causal=causal, window=window, cross=cross)
    pad = padding_mask(attention_mask.to(device) if device is not None else attention_mask)
    may_attend = pad if may_attend is None else may_attend & pad  # (B, 1, T, S)
    return Mask(may_attend, empty_rows=~may_attend.any(dim=-1, keepdim=True),  # (B, 1, T, 1)
                padding=pad[:, 0, 0], causal=causal, window=window, cross=cross)  # (B, S)


# ----------------------------------------------------------------------------- attend


def query_rows(rows: tuple[int, ...], T: int) -> list[int]:
    """The rows of a pass's T queries that `rows` names (negative counts from the end: -1 is
    the last), ascending, each once."""
    bad = [r for r in rows if not -T <= r < T]
    if bad:
        raise ValueError(f"trace rows {bad} out of range for this pass's {T} query rows: "
                         f"0 to {T - 1}, or -{T} to -1 counting from the last")
    return sorted({r % T for r in rows})
