"""Generation: new tokens from a GPT, one decode step at a time over a static KV cache.

Small named functions in the order a token goes through them (gpt-fast's generate.py): `prefill`
runs the prompt once and fills the cache, `decode_one_token` runs one new token per row against
it, and `sampling.py`'s processors (`SeenIds.penalize`, `ban_repeated_ngrams`,
`logits_to_probs`, `sample`: transformers' repetition penalty, no-repeat n-grams, temperature,
top-k, top-p, min-p and typical-p) turn logits into the next ids. `stream` yields each step's
ids as they come and `generate` collects them; `stream_text` and `generate_text` do the same
from and to text with a tokenizer (stop strings live there, since they need one;
`tokenizers.streaming` decodes the new ids). Batched prompts are left-padded
(`Tokenizer.encode_batch`): positions come from the attention mask, so every row decodes exactly
as it would alone. With `edits` (`interp.edits.Edits`: ablated heads, patched values) every step
runs `GPT.forward` over the KV cache, which reports to the edit seam; `DecodeStep` stays
edit-free. With `compile=True` the steps run `model.compiled_decode`'s fixed-shape step
(torch.compile, CUDA graphs on a GPU) over a static cache kept with the model (edits still take
`GPT.forward`). The model and the cache know nothing about sampling; this module knows nothing
about attention.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ..interp.edits import Edits
from ..model.compiled_decode import check_compilable, compiled_decode
from ..model.decode import DecodeStep, decode_step, decodes_by_forward
from ..model.gpt import GPT, check_id_batch, check_mask_values, require_eval
from ..model.kv_cache import KVCache
from ..tokenizers import check_fits
from ..tokenizers.streaming import TextPieces

# generation_memory, logits_to_probs and sample re-exported: `from attnlab.generate import
# sample` still works
from .memory import generation_memory as generation_memory
from .sampling import SeenIds, ban_repeated_ngrams, check_sampling
from .sampling import logits_to_probs as logits_to_probs
from .sampling import sample as sample

if TYPE_CHECKING:
    from ..interp.edits import Edit
    from ..tokenizers import Tokenizer


@dataclass
class GenerationConfig:
    """How to extend a prompt: keyword arguments of `generate`, `stream` and
    `generate_text`, checked together when made (`generate_text(model, tok, prompts,
    **dataclasses.asdict(config))`). `attnlab generate` has a flag for each (`--top-k 40`),
    with two defaults of its own: --temperature 0.8 (nanoGPT's sample.py's; 1.0 here samples
    the model's distribution as it is) and, without --max-new-tokens, 200 tokens or as many as
    the context has room for."""

    max_new_tokens: int = 200  # tokens to add to every prompt
    temperature: float = 1.0  # divides the logits; 0 = greedy (argmax)
    top_k: int = 0  # sample among the k most likely ids; 0 (or >= V) = all of them
    top_p: float = 1.0  # nucleus: smallest set of ids holding top_p of the mass; 1 = all
    min_p: float = 0.0  # drop ids less likely than min_p x the most likely one; 0 = none
    typical_p: float = 1.0  # keep the ids nearest the entropy holding this mass; 1 = all
    repetition_penalty: float = 1.0  # seen ids' logits / it (x it if < 0); greedy too; 1 = off
    no_repeat_ngram_size: int = 0  # never make an n-gram of this size twice; greedy too; 0 = off
    seed: int | None = None  # seeds a private generator (reproducible); None = torch's RNG
    sliding_window: bool = False  # past block_size, condition on the last block_size tokens

    def __post_init__(self) -> None:
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={self.max_new_tokens!r} must be a positive integer")
        check_sampling(self.temperature, self.top_k, self.top_p, self.min_p,
                       self.repetition_penalty, self.typical_p, self.no_repeat_ngram_size)


# ----------------------------------------------------------------------------- model steps


def prefill(
    model: GPT, input_ids: Tensor, attention_mask: Tensor | None, cache: KVCache,
    edits: Edit | Edits | None = None,
) -> Tensor:
    """Run prompts (B, P) through the model, filling `cache`; return next-token logits (B, V).

    Also one step of edited generation (P = 1 over the cache): `GPT.forward` takes the edits.
    """
    out = model(input_ids, attention_mask=attention_mask, kv_cache=cache, edits=edits,
                last_logits_only=True)
    return out.logits[:, -1]  # (B, V)


def decode_one_token(
    decode: DecodeStep, token: Tensor, attention_mask: Tensor | None, cache: KVCache
) -> Tensor:
    """One new id per row (B, 1) against the cache -> next-token logits (B, V).

    `decode` is the model's `DecodeStep` (`decode.decode_step`: kept with the model while its
    weights stay the same tensors, packed as float16 after `half_weights`): `GPT.forward` at
    T = 1 with the weights laid out for it, tested equal to it. attention_mask (B, S) covers cached
    + new positions; None when no row has padding, so attention runs with no mask at all.
    """
    return decode(token, attention_mask, cache)  # (B, V)


# ----------------------------------------------------------------------------- token loop


def _check_prompt(
    model: GPT, input_ids: Tensor, attention_mask: Tensor | None, config: GenerationConfig
) -> Tensor | None:
    """Validate once, before the loop; returns the mask, or None when nothing is padded."""
    check_id_batch(input_ids, "input_ids")
    B, P = input_ids.shape
    require_eval(model, "generation")
    block = model.config.block_size
    # the last new token is never fed back, so P + max_new_tokens - 1 positions are run
    if P + config.max_new_tokens - 1 > block and not config.sliding_window:
        raise ValueError(
            f"prompt of {P} token{'s' * (P != 1)} + max_new_tokens={config.max_new_tokens} "
            "exceeds "
            f"block_size={block} (it runs {P + config.max_new_tokens - 1} positions); "
            "shorten the prompt, lower max_new_tokens, or pass "
            "sliding_window=True (CLI: --sliding-window) to condition on the last block_size "
            "tokens"
        )
    if attention_mask is None:
        return None
    if attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"attention_mask shape {tuple(attention_mask.shape)} != input_ids shape {(B, P)}; "
            "pass the mask made with the ids (Tokenizer.encode_batch gives both)"
        )
    check_mask_values(attention_mask)  # as GPT.forward does: a 2 would read as a token
    keep = attention_mask.to(input_ids.device).bool()  # (B, P)
    if not bool(keep[:, -1].all()) or bool((keep[:, 1:] < keep[:, :-1]).any()):
        raise ValueError(
            "attention_mask must be left-padded (zeros, then ones) with at least one token per "
            "row, so every row's last token is in the last column; build batches with "
            "Tokenizer.encode_batch"
        )
    return None if bool(keep.all()) else keep


def stream(
    model: GPT,
    input_ids: Tensor,
    attention_mask: Tensor | None = None,
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
    typical_p: float = 1.0,
    repetition_penalty: float = 1.0,
    no_repeat_ngram_size: int = 0,
    eot_id: int | Sequence[int] | None = None,
    pad_id: int | None = None,
    seed: int | None = None,
    generator: torch.Generator | None = None,
    sliding_window: bool = False,
    vocab_size: int | None = None,
    row_seeds: Sequence[int] | None = None,
    edits: Edit | Edits | None = None,
    unused_ids: Sequence[int] = (),
    compile: bool = False,
) -> Iterator[Tensor]:
    """Yield the new ids (B,) of each step as they are sampled, up to max_new_tokens steps.

    input_ids (B, P) with a left-padded attention_mask (B, P), 1 = token, 0 = pad.
    temperature, top_k, top_p, min_p and typical_p shape the distribution sampled from, in
    transformers' order (temperature 0: greedy, the others ignored); before them, greedy or
    not, repetition_penalty scales the logits of every id a row holds (prompt and new ids, not
    its padding) and no_repeat_ngram_size > 0 bans each id that would repeat an n-gram of
    that many ids the row holds (`sampling.py`). A row that samples eot_id (an id, or
    several: any of them) has ended: it yields pad_id (default: the first eot id) from then
    on, and the loop stops early once every row has ended. seed gives a private generator,
    so the same seed gives the same ids. vocab_size: sample only ids below it (a tokenizer
    smaller than the model's embedding table). unused_ids: never sample these either (ids
    below vocab_size that name no token: `Tokenizer.unused_ids`). row_seeds: one seed per row
    instead, each row drawing from its own generator, so a row's draws do not depend on which
    rows share its batch (one generator's draws for row b depend on how many rows come before
    it). edits: generate with these `interp.edits.Edits` applied at every step (slower:
    `GPT.forward` per token). A model of `decode.half_weights` decodes with its matrices
    streamed as float16. compile: decode through the model's compiled fixed-shape step
    (`model.compiled_decode`: CUDA graphs on a GPU; the first generation of a batch size and
    cache length pays the compilation, later ones reuse it); the same ids as without, up to
    the rounding of a different kernel order; with edits the steps stay eager. Arguments are
    checked here, before the first step. The weights must not change until the last step
    (docs/generate.md#how-decoding-works): edit what generation computes with `edits`.
    """
    config = GenerationConfig(
        max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
        min_p=min_p, typical_p=typical_p, repetition_penalty=repetition_penalty,
        no_repeat_ngram_size=no_repeat_ngram_size, seed=seed, sliding_window=sliding_window)
    if not isinstance(input_ids, Tensor):
        raise TypeError(f"input_ids is a {type(input_ids).__name__}; pass a (B, P) tensor of "
                        "token ids, e.g. torch.tensor([ids])")
    input_ids = input_ids.to(model.wte.weight.device)  # the caller's may be on the host
    attention_mask = None if attention_mask is None else attention_mask.to(input_ids.device)
    keep = _check_prompt(model, input_ids, attention_mask, config)
    if edits is not None:
        edits.check(model.config)
    if compile:
        check_compilable(model)
    draws = _generators(seed, generator, row_seeds, input_ids)
    stops = [eot_id] if isinstance(eot_id, int) else list(eot_id or ())
    pad = (stops[0] if stops else 0) if pad_id is None else pad_id
    ends = torch.tensor(stops, dtype=torch.long, device=input_ids.device) if stops else None
    unused = torch.tensor(sorted(unused_ids), dtype=torch.long, device=input_ids.device) \
        if unused_ids else None
    return _steps(model, input_ids, keep, config, ends, pad, draws, vocab_size, unused, edits,
                  compile and edits is None)


def _generators(seed: int | None, generator: torch.Generator | None,
                row_seeds: Sequence[int] | None, input_ids: Tensor,
                ) -> torch.Generator | list[torch.Generator] | None:
    """What the steps draw from: one generator (given, or seeded), one per row, or torch's."""
    given = [name for name, value in (("seed", seed), ("generator", generator),
                                      ("row_seeds", row_seeds)) if value is not None]
    if len(given) > 1:
        raise ValueError(f"pass seed or generator or row_seeds, not {' and '.join(given)}")
    device = input_ids.device
    if row_seeds is not None:
        if len(row_seeds) != input_ids.shape[0]:
            raise ValueError(f"row_seeds has {len(row_seeds)} seeds for {input_ids.shape[0]} "
                             "rows; give one per prompt")
        return [torch.Generator(device=device).manual_seed(int(s)) for s in row_seeds]
    return generator if seed is None else torch.Generator(device=device).manual_seed(seed)


def _new_cache(model: GPT, batch_size: int, length: int, edits: Edit | Edits | None
               ) -> KVCache:
    """The model's cache for a generation: per head where an edit changes a head's keys
    before they are cached, which a latent cache cannot keep (`latent.py`)."""
    per_head = edits is not None and any(e.name == "k_pre_rope" for e in Edits([edits]).edits)
    return model.new_cache(batch_size, length, per_head=per_head)


@torch.inference_mode()
def _steps(
    model: GPT,
    input_ids: Tensor,
    keep: Tensor | None,
    config: GenerationConfig,
    eot_ids: Tensor | None,
    pad_id: int,
    generator: torch.Generator | list[torch.Generator] | None,
    vocab_size: int | None,
    unused_ids: Tensor | None,
    edits: Edit | Edits | None,
    compile: bool,
) -> Iterator[Tensor]:
    B, P = input_ids.shape
    N, block = config.max_new_tokens, model.config.block_size
    device = input_ids.device
    # Preallocated history and mask: a step writes one column and passes views, so the loop
    # allocates nothing that grows with the context.
    tokens = torch.empty(B, P + N, dtype=torch.long, device=device)  # (B, P + N)
    tokens[:, :P] = input_ids
    mask_buf: Tensor | None = None
    if keep is not None:
        mask_buf = torch.ones(B, P + N, dtype=torch.bool, device=device)  # (B, P + N)
        mask_buf[:, :P] = keep
    start = max(0, P - block)  # first position inside the window (sliding_window only)
    switch = None if model.rotary is None else model.rotary.switch  # longrope's
    # which ids each row holds, for the repetition penalty: a fixed (B, V + 1) buffer written
    # in place, outside the decode step (compiled or not), which only returns logits
    seen = SeenIds(input_ids, keep, model.config.vocab_size) \
        if config.repetition_penalty != 1.0 else None
    compiled = compiled_decode(model, B, min(P + N, block)) if compile else None
    if compiled is not None:
        compiled.in_use = True  # its static cache is this generation's until it ends
    try:
        cache = compiled.cache if compiled is not None else _new_cache(
            model, B, min(P + N, block), edits)
        window_mask = None if mask_buf is None else mask_buf[:, start:P]
        logits = prefill(model, tokens[:, start:P], window_mask, cache, edits)  # (B, V)
        if compiled is not None:
            compiled.start(window_mask)
        # the decode step runs neither latent attention (DeepSeek's) nor FP8 attention
        # matrices: the model's forward decodes those
        decode = decode_step(model) if edits is None and not decodes_by_forward(model) else None
        ended = torch.zeros(B, dtype=torch.bool, device=device)  # (B,) rows that sampled an eot
        for length in range(P, P + N):
            if vocab_size is not None:
                logits = logits[:, :vocab_size]  # (B, V')
            if unused_ids is not None:  # out of place: logits may be the model's own output
                logits = logits.index_fill(1, unused_ids, float("-inf"))  # (B, V')
            held = None if mask_buf is None else mask_buf[:, :length]  # (B, length)
            next_ids = _draw(logits, config, generator, seen, tokens[:, :length], held)  # (B,)
            if eot_ids is not None:
                next_ids = next_ids.masked_fill(ended, pad_id)  # (B,)
                ended |= torch.isin(next_ids, eot_ids)
            if seen is not None:
                seen.add(next_ids)
            tokens[:, length] = next_ids
            yield next_ids
            end = length + 1
            # without eot ids nothing ends a row: no device sync per step to ask
            if end == P + N or (eot_ids is not None and bool(ended.all())):
                return
            if _encode_again(cache, switch, end):
                start, cache.seq_len = max(0, end - block), 0
                window_mask = None if mask_buf is None else mask_buf[:, start:end]
                logits = prefill(model, tokens[:, start:end], window_mask, cache, edits)
                if compiled is not None:
                    compiled.start(window_mask)
            else:
                window_mask = None if mask_buf is None else mask_buf[:, start:end]
                if decode is None:  # edits: the model's own forward, which reports to the seam
                    logits = prefill(model, tokens[:, length:end], window_mask, cache, edits)
                elif compiled is not None:
                    logits = compiled(decode, tokens[:, length:end])  # (B, V)
                else:
                    logits = decode_one_token(decode, tokens[:, length:end], window_mask, cache)
    finally:
        if compiled is not None:
            compiled.in_use = False


def _encode_again(cache: KVCache, switch: int | None, end: int) -> bool:
    """Whether the next step encodes the sequence again instead of decoding one token:
    when the window is full (positions are learned absolute embeddings, so cached keys
    cannot be shifted: the last block_size tokens from position 0, nanoGPT's crop), or when
    the sequence crosses longrope's `switch` (every position takes the long frequencies, the
    cached keys too, as transformers' Phi-3 `generate` does)."""
    return cache.seq_len == cache.max_len or (switch is not None and
                                              cache.seq_len <= switch < end)


def _draw(logits: Tensor, config: GenerationConfig,
          generator: torch.Generator | list[torch.Generator] | None,
          seen: SeenIds | None, ids: Tensor, keep: Tensor | None) -> Tensor:
    """logits (B, V) -> next ids (B,), sampled in float32 whatever the model computes in (a
    bfloat16 softmax is coarse; transformers' generate() casts too), after the repetition
    penalty when `seen` is kept and the no-repeat n-gram ban over each row's ids so far (B, L)
    (keep (B, L): real, not padding; None: no padding), in transformers' order; a list holds
    one generator per row (stream's row_seeds)."""
    logits = logits.float()  # (B, V)
    if seen is not None:
        logits = seen.penalize(logits, config.repetition_penalty)  # (B, V)
    if config.no_repeat_ngram_size > 0:
        logits = ban_repeated_ngrams(logits, ids, keep, config.no_repeat_ngram_size)  # (B, V)
    how = config.temperature, config.top_k, config.top_p
    min_p, typical_p = config.min_p, config.typical_p
    if isinstance(generator, list):
        return torch.cat([sample(logits[b:b + 1], *how, row_generator, min_p=min_p,
                                 typical_p=typical_p)
                          for b, row_generator in enumerate(generator)])  # (B,)
    return sample(logits, *how, generator, min_p=min_p, typical_p=typical_p)  # (B,)


def generate(
    model: GPT,
    input_ids: Tensor,
    attention_mask: Tensor | None = None,
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
    typical_p: float = 1.0,
    repetition_penalty: float = 1.0,
    no_repeat_ngram_size: int = 0,
    eot_id: int | Sequence[int] | None = None,
    pad_id: int | None = None,
    seed: int | None = None,
    generator: torch.Generator | None = None,
    sliding_window: bool = False,
    vocab_size: int | None = None,
    row_seeds: Sequence[int] | None = None,
    edits: Edit | Edits | None = None,
    unused_ids: Sequence[int] = (),
    compile: bool = False,
) -> Tensor:
    """Prompts (B, P) -> (B, P + n): the prompts followed by n <= max_new_tokens new ids.

    n is smaller than max_new_tokens only when every row ended with an eot id; a row that ended
    earlier is filled with pad_id after its eot. See `stream` for the arguments.
    """
    steps = list(stream(
        model, input_ids, attention_mask, max_new_tokens=max_new_tokens,
        temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, typical_p=typical_p,
        repetition_penalty=repetition_penalty, no_repeat_ngram_size=no_repeat_ngram_size,
        eot_id=eot_id, pad_id=pad_id, seed=seed,
        generator=generator, sliding_window=sliding_window, vocab_size=vocab_size,
        row_seeds=row_seeds, edits=edits, unused_ids=unused_ids, compile=compile,
    ))
    new_ids = torch.stack(steps, dim=1)  # (B, n) on the model's device
    return torch.cat([input_ids.to(new_ids.device), new_ids.to(input_ids.dtype)], dim=1)


# ----------------------------------------------------------------------------- text


#: the keyword arguments `stream_text` and `generate_text` pass on to `stream`
SAMPLING = frozenset({"temperature", "top_k", "top_p", "min_p", "typical_p",
                      "repetition_penalty", "no_repeat_ngram_size", "seed", "generator",
                      "row_seeds", "sliding_window", "compile"})


def stream_text(
    model: GPT,
    tokenizer: Tokenizer,
    prompts: Sequence[str],
    *,
    max_new_tokens: int,
    stop: str | Sequence[str] = (),
    edits: Edit | Edits | None = None,
    **sampling: float | int | bool | Sequence[int] | None,
) -> TextPieces:
    """Yield, per step, the new text of every prompt ("" when a row has nothing new yet);
    the iterator's `made` counts each prompt's new tokens so far.

    Each row's generated ids are decoded whole and only the new suffix is emitted, so a
    character split over several byte-level tokens comes out once it is complete. A row ends
    at one of the tokenizer's stop ids (not emitted) or at a stop string (emitted up to it);
    `stop` is one string or several.
    sampling: `SAMPLING`'s names (temperature, top_k, top_p, min_p, typical_p,
    repetition_penalty, no_repeat_ngram_size, seed, ...) as for `stream`.
    Arguments are checked here, before the first step (so a CLI can fail before it prints
    the prompt).
    edits: `interp.edits.Edits` applied at every step.
    """
    if isinstance(prompts, str):
        raise ValueError("prompts must be a list of strings; wrap a single prompt as [prompt]")
    unknown = sorted(set(sampling) - SAMPLING)
    if unknown:  # else stream() would name itself, which the caller never called
        raise TypeError(f"unknown sampling argument(s) {unknown}; choose from {sorted(SAMPLING)}")
    check_fits(tokenizer, model.config.vocab_size)
    stops = [s for s in ([stop] if isinstance(stop, str) else stop) if s]
    input_ids, attention_mask = tokenizer.encode_batch(list(prompts))  # (B, P) each
    empty = attention_mask[:, -1] == 0  # (B,)
    if bool(empty.any()):
        # unconditional samples start from the BOS, as transformers' generate() does, or
        # (GPT-2's convention, and attnlab's own tokenizers) from <|endoftext|>
        start = getattr(tokenizer, "bos_id", None)
        start = tokenizer.eot_id if start is None else start
        if start is None:
            raise ValueError(
                f"prompts[{int(empty.nonzero()[0])}] is empty and tokenizer {tokenizer.name!r} "
                "has no begin- or end-of-text id to start from; give at least one character"
            )
        input_ids[empty, -1], attention_mask[empty, -1] = start, 1
    device = model.wte.weight.device
    steps = stream(
        model, input_ids.to(device), attention_mask.to(device), max_new_tokens=max_new_tokens,
        eot_id=tokenizer.stop_ids, pad_id=tokenizer.pad_id, vocab_size=tokenizer.vocab_size,
        unused_ids=tokenizer.unused_ids, edits=edits, **sampling,  # type: ignore[arg-type]
    )
    prompt_ids = [row[keep].tolist() for row, keep in zip(input_ids, attention_mask.bool(),
                                                           strict=True)]
    return TextPieces(steps, tokenizer, prompt_ids, stops)


def generate_text(
    model: GPT,
    tokenizer: Tokenizer,
    prompts: Sequence[str],
    *,
    max_new_tokens: int,
    stop: str | Sequence[str] = (),
    edits: Edit | Edits | None = None,
    **sampling: float | int | bool | Sequence[int] | None,
) -> list[str]:
    """The completion (without its prompt) of every prompt, batched and left-padded."""
    completions = [""] * len(prompts)
    for pieces in stream_text(
        model, tokenizer, prompts, max_new_tokens=max_new_tokens, stop=stop, edits=edits,
        **sampling,
    ):
        completions = [c + p for c, p in zip(completions, pieces, strict=True)]
    return completions
