"""What every route of the viewer shares: its limits (`ServeConfig`), the error a route raises
for a bad request (`RequestError`), and `ViewerState`, the one served model with its tokenizer,
its queue (`locked`: one model call at a time, in turn, stopped at its next block when its
client leaves or the server stops), the flag that says the server is stopping, and the checks
that turn a request's text or ids into token ids.

The routes (`routes/`) and `app.py` import this module; it imports no web framework at import
time (anyio, the serve extra's, only inside `ViewerState`'s methods), so `import attnlab`
works without the `serve` extra. What the answers hold is `payloads.py`'s.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ..model.gpt import GPT
from ..model.runtime import release_kept_memory
from ..tokenizers import check_fits
from .payloads import TextTokenizer, sample_texts


@dataclass
class ServeConfig:
    """Limits of the HTTP API. Token counts are also capped by the model's block_size."""

    max_text_chars: int = 20_000  # longest `text` accepted by /api/attention and /api/generate
    max_body_bytes: int = 256 * 1024  # request bodies above this get 413 before parsing
    max_new_tokens: int = 1024  # upper bound of `max_new_tokens` (block_size caps it too)
    decimals: int = 5  # attention weights are rounded to this many decimals in JSON
    # weights in one /api/attention answer (layers x heads x T(T+1)/2): 10M fits one layer
    # of GPT-2 medium (16 heads) at 1024 tokens and keeps all-layer requests from gigabytes;
    # and in one /api/routing answer (layers x T x n_experts)
    max_weights: int = 10_000_000

    def __post_init__(self) -> None:
        for name in ("max_text_chars", "max_body_bytes", "max_new_tokens", "max_weights"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"ServeConfig.{name}={value!r} must be a positive integer")
        if not 1 <= self.decimals <= 8:
            raise ValueError(
                f"ServeConfig.decimals={self.decimals} must be in [1, 8]: fewer loses the "
                "small weights, more only adds float32 noise and bytes"
            )


# seconds between two looks at whether a computing request's client is still there: a
# request stops within this (and one block) of its client leaving
LEFT_POLL_S = 0.05


class RequestError(Exception):
    """A bad request: its message (what was wrong, how to fix it) goes back as JSON."""

    def __init__(self, message: str, status: int = 422) -> None:
        super().__init__(message)
        self.status = status


class _Stopped(Exception):
    """Raised before a block of a model call whose request was cancelled (`_BlockStops`), so
    the call ends there; `ViewerState.locked` turns it into a `RequestError`."""


class _BlockStops:
    """A forward pre-hook on each block of a model that raises `_Stopped` in a thread that
    runs a viewer call once that call is cancelled: put on once per model (`of`: every app
    made on that model shares it), and armed per call in its own thread (`armed`), since
    hooks put on and taken off per call cost a generation about 13 us a token per block
    (docs/performance.md#viewer-cancel). Outside the apps' calls it does nothing. A decode
    step never calls the blocks (`DecodeStep` runs their weights itself): a generation stops
    between tokens."""

    def __init__(self, model: GPT) -> None:
        # thread id -> whether the call it runs is cancelled, for the calls under way
        self.armed: dict[int, Callable[[], bool]] = {}
        for block in model.blocks:
            block.register_forward_pre_hook(self)

    @classmethod
    def of(cls, model: GPT) -> _BlockStops:
        """The model's hooks, put on by the first app made on it: one app after another on
        one model (a notebook) piled a set up per app, each run by every forward after. The
        hook holds no reference to the model, so the model still goes when nothing else
        holds it."""
        stops = _STOPS.get(model)
        if stops is None:
            stops = _STOPS[model] = cls(model)
        return stops

    def __call__(self, *_: Any) -> None:
        cancelled = self.armed.get(threading.get_ident())
        if cancelled is not None and cancelled():
            raise _Stopped


_STOPS: weakref.WeakKeyDictionary[GPT, _BlockStops] = weakref.WeakKeyDictionary()


def model_summary(
    model: GPT, tokenizer: TextTokenizer, meta: dict[str, Any] | None, config: ServeConfig
) -> dict[str, Any]:
    """The JSON body of /api/model."""
    c = model.config
    return {
        "config": c.to_dict(),
        "n_params": model.num_params(non_embedding=False),
        "tokenizer": {
            "name": getattr(tokenizer, "name", type(tokenizer).__name__),
            "vocab_size": tokenizer.vocab_size,
            "eot_id": getattr(tokenizer, "eot_id", None),
        },
        "meta": meta or {},
        "sample": sample_texts(tokenizer, c.block_size, meta),
        "limits": {
            "max_tokens": c.block_size,
            "max_text_chars": config.max_text_chars,
            "max_new_tokens": config.max_new_tokens,
            "max_body_bytes": config.max_body_bytes,
        },
    }


@dataclass
class ViewerState:
    """The served model and what its routes share; `ViewerState.of` builds it."""

    model: GPT
    tokenizer: TextTokenizer
    limits: ServeConfig
    stop_ids: tuple[int, ...]  # token ids that end a generation (the tokenizer's)
    summary: dict[str, Any]  # the body of /api/model, built once
    # set when the server stops (`attnlab serve` sets it on Ctrl-C or SIGTERM): the call under
    # way ends before its next block, a generation at its next token, and a waiting request
    # gets a 503, so shutdown takes at most one block (or one token)
    stopping: threading.Event = field(default_factory=threading.Event)
    # one forward at a time: torch already uses every core
    lock: threading.Lock = field(default_factory=threading.Lock)
    # the requests waiting for `lock`, first come first served: an anyio.Lock (the serve
    # extra's, made on first use) per event loop, so that they wait in the loop, not in the
    # threadpool, whose 40 threads also read the page's static files. Per loop: a TestClient
    # runs each request in a loop of its own; `lock` still keeps the loops' calls apart
    turns: weakref.WeakKeyDictionary[Any, Any] = field(
        default_factory=weakref.WeakKeyDictionary)
    stops: _BlockStops = field(init=False)  # ends a cancelled call before its next block

    def __post_init__(self) -> None:
        self.stops = _BlockStops.of(self.model)

    @classmethod
    def of(cls, model: GPT, tokenizer: TextTokenizer, meta: dict[str, Any] | None,
           limits: ServeConfig, stopping: threading.Event | None = None) -> ViewerState:
        """The state of an app serving `model` (put in eval mode) and its `tokenizer`;
        `stopping`: the event that says the server is stopping (a new one if None)."""
        check_fits(tokenizer, model.config.vocab_size)
        model.eval()
        return cls(model, tokenizer, limits, tuple(getattr(tokenizer, "stop_ids", ())),
                   model_summary(model, tokenizer, meta, limits),
                   stopping if stopping is not None else threading.Event())

    def encode(self, text: str) -> list[int]:
        """The token ids of a request's `text`, checked against the limits and block_size."""
        max_chars = self.limits.max_text_chars
        if len(text) > max_chars:
            raise RequestError(f"text has {len(text)} characters; the limit is {max_chars} "
                               "(shorten it, or start the server with a larger "
                               "--max_text_chars)")
        try:
            ids = list(self.tokenizer.encode(text))
        except ValueError as err:  # a character the vocabulary lacks: the tokenizer says which
            raise RequestError(str(err)) from None
        if not ids:
            raise RequestError("text is empty: type at least one character")
        self.check_length(ids)
        return ids

    def request_ids(self, text: str | None, ids: list[int] | None) -> list[int]:
        """The token ids a request names by exactly one of `text` (tokenized here) or `ids`
        (a generation's tokens, say), checked."""
        if (text is None) == (ids is None):
            raise RequestError("send exactly one of 'text' or 'ids'")
        return self.checked_ids(ids) if ids is not None else self.encode(text or "")

    def checked_ids(self, ids: list[int]) -> list[int]:
        """A request's token `ids`, checked against the vocabulary and block_size."""
        if not ids:
            raise RequestError("ids is empty: send at least one token id")
        vocab_size = self.model.config.vocab_size
        bad = [i for i in ids if not 0 <= i < vocab_size]
        if bad:
            raise RequestError(f"token ids {bad[:5]} are outside the vocabulary [0, {vocab_size})")
        self.check_length(ids)
        return ids

    def layer_count(self, layers: list[int] | None) -> int:
        """How many layers a request's `layers` asks for (None: every one), once checked to
        be a non-empty list of the model's layer indices (a repeat counts once)."""
        n_layer = self.model.config.n_layer
        if layers is None:
            return n_layer
        if not layers or any(not 0 <= i < n_layer for i in layers):
            raise RequestError(
                f"layers {layers} must be a non-empty list of layer indices in [0, {n_layer})")
        return len(set(layers))

    def check_length(self, ids: list[int]) -> None:
        """Reject more than block_size tokens."""
        block_size = self.model.config.block_size
        if len(ids) > block_size:
            raise RequestError(
                f"the text is {len(ids)} tokens; the model sees at most block_size={block_size}: "
                f"shorten it to {block_size} tokens"
            )

    def out_of_memory(self, err: BaseException) -> RequestError:
        """The answer to a request the device had no memory for (503), naming the limits that
        bound a request's size; the cache the allocator kept is freed for the next request."""
        device = self.model.wte.weight.device
        if device.type == "cuda":
            torch.cuda.empty_cache()
        said = ". ".join(str(err).split("\n")[0].split(". ")[:2]).rstrip(".")
        limits = self.limits
        return RequestError(
            f"out of memory on {device} for this request ({said or 'OutOfMemoryError'}); send "
            f"a shorter text or fewer layers, or restart the server with lower limits "
            f"(--max_text_chars {limits.max_text_chars}, --max_weights {limits.max_weights}, "
            f"--max_new_tokens {limits.max_new_tokens}) or --dtype bfloat16", status=503)

    def stopped(self) -> RequestError:
        """The answer to a request the stopping server will not compute (503)."""
        return RequestError("attnlab serve is stopping; start it again and resend the request",
                            status=503)

    async def locked(self, fn: Callable[[], Any],
                     left: Callable[[], Awaitable[bool]] | None = None) -> Any:
        """fn() in a worker thread under the model lock, in the order the requests came (a
        generation takes its turn per token, so attention requests interleave with a long
        generation). `left()` says whether the client went away: a request whose client left
        while it waited is dropped (499) rather than computed for no one, and one whose client
        leaves while it computes (or whose task is cancelled: a stream's client left, the
        server cut it) stops before the model's next block, as every call does once the server
        is stopping; the next request's turn comes then. Raises `RequestError` for those (499
        for the client, nobody reads it; 503: `stopped`) and when the device has no memory
        for the request (503: `out_of_memory`)."""
        import anyio  # the serve extra: routes only

        # this call's own flag: one set late (its client left as the call ended) is read by no
        # later call, and `stops` reads it only in this call's thread, while it runs
        cancel = threading.Event()

        def cancelled() -> bool:
            return cancel.is_set() or self.stopping.is_set()

        def call() -> Any:
            with self.lock:
                try:
                    if cancelled():  # it went while this thread started: not one block
                        raise _Stopped
                    self.stops.armed[threading.get_ident()] = cancelled
                    return fn()
                except _Stopped:
                    raise (self.stopped() if self.stopping.is_set() else RequestError(
                        "the client left while its request computed", status=499)) from None
                except torch.OutOfMemoryError as err:  # this request's: the next one is served
                    raise self.out_of_memory(err) from None
                finally:
                    self.stops.armed.pop(threading.get_ident(), None)
                    # runtime keeps a trace's freed (nh, T, T) buffers for a later one of the
                    # same size; texts of every length would pile them up
                    # (docs/performance.md#viewer-memory)
                    release_kept_memory()

        turn = self.turns.setdefault(asyncio.get_running_loop(), anyio.Lock())
        async with turn:
            if self.stopping.is_set():
                raise self.stopped()
            if left is not None and await left():
                # nginx's code for a client that closed the connection; nobody reads it
                raise RequestError("the client left before its turn", status=499)
            return await _watched(call, cancel, left)


async def _watched(call: Callable[[], Any], cancel: threading.Event,
                   left: Callable[[], Awaitable[bool]] | None) -> Any:
    """call() in a worker thread, `cancel` set once `left()` (asked every LEFT_POLL_S while
    the call runs) says the client went away, or once this task is cancelled (a stream's
    client left, the server cut it). The task waits for the thread even then, so its turn is
    held until the model is free: `cancel` ends the call at its next block meanwhile. A timer
    asks `left`, not a task that waits beside the call: a generation comes here per token,
    and a task group per call cost it 0.1-0.3 ms a token (docs/performance.md#viewer-cancel)."""
    import anyio

    loop = asyncio.get_running_loop()
    job = loop.run_in_executor(None, call)
    asking: set[asyncio.Task[None]] = set()  # the loop holds its tasks weakly

    async def ask(probe: Callable[[], Awaitable[bool]]) -> None:
        if await probe():
            cancel.set()
        elif not job.done():
            timer[0] = loop.call_later(LEFT_POLL_S, look, probe)

    def look(probe: Callable[[], Awaitable[bool]]) -> None:
        task = loop.create_task(ask(probe))
        asking.add(task)
        task.add_done_callback(asking.discard)

    timer = [loop.call_later(LEFT_POLL_S, look, left)] if left is not None else []
    try:
        return await asyncio.shield(job)
    except asyncio.CancelledError:  # anyio's cancellation too, on asyncio
        cancel.set()
        with anyio.CancelScope(shield=True):
            await asyncio.wait({job})
        job.exception()  # read: its RequestError (499, 503) goes to no one, unlogged
        raise
    finally:
        for handle in timer:
            handle.cancel()
