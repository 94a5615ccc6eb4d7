"""The attention viewer: an HTTP API over one model and the static page in `web/`.

`create_app(model, tokenizer, meta)` returns an ASGI app (FastAPI) with
    GET  /                 the page (web/index.html; web/app.js and web/style.css under /static/)
    GET  /api/model        config, parameter count, tokenizer, training summary, limits
    POST /api/attention    {text | ids, layers?, norms?} -> tokens and attention weights
    POST /api/generate     {text, max_new_tokens, temperature, top_k, top_p, seed} -> SSE stream
    POST /api/heads        {text, ablate?} -> head detector scores, next token with heads ablated
    POST /api/lens         {text} -> logit lens: top tokens after each layer (server_heads.py)
    GET  /openapi.json     the schema (FastAPI); GET /docs renders it (web/docs.html, offline)
This module owns the HTTP surface: validation, limits, locking, serialization. What the
answers hold (attention payloads, token streams, sample texts) is `viewer_data.py`'s; the
model math is `model.py`'s, the sampling `generate.py`'s, the captured weights `trace.py`'s,
and the drawing the page's (`web/app.js`). Starting a server (uvicorn) is `cli/serve.py`'s job.

Every bad request gets a 4xx JSON body `{"error": "...", "detail": [...]}`, never a 500.
Model calls run in the threadpool, one at a time behind a lock (a generation takes the
lock per token, so attention requests interleave with a long generation).

FastAPI and pydantic (the `serve` extra) are imported inside `create_app`, so importing this
module, and `attnlab --help`, work without them. No `from __future__ import annotations`
here: FastAPI reads endpoint annotations at runtime, and the request models are classes
local to `create_app`.
"""

import json
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ..model.gpt import GPT
from ..model.runtime import release_kept_memory
from ..tokenizers import check_fits
from .asgi import BodyLimit
from .payloads import TextTokenizer, attention_payload, sample_texts, token_stream

__all__ = ["RequestError", "ServeConfig", "TextTokenizer", "attention_payload", "create_app",
           "model_summary"]

if TYPE_CHECKING:
    from fastapi import FastAPI


WEB_DIR = Path(__file__).parent / "web"
_CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".png": "image/png",
    ".svg": "image/svg+xml",
}
# The page works offline: it may load nothing but its own files (no CDN, no fonts).
_CSP = "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'"


@dataclass
class ServeConfig:
    """Limits of the HTTP API. Token counts are also capped by the model's block_size."""

    max_text_chars: int = 20_000  # longest `text` accepted by /api/attention and /api/generate
    max_body_bytes: int = 256 * 1024  # request bodies above this get 413 before parsing
    max_new_tokens: int = 1024  # upper bound of `max_new_tokens` (block_size caps it too)
    decimals: int = 5  # attention weights are rounded to this many decimals in JSON
    # weights in one /api/attention answer (layers x heads x T(T+1)/2): 10M fits one layer
    # of GPT-2 medium (16 heads) at 1024 tokens and keeps all-layer requests from gigabytes
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


class RequestError(Exception):
    """A bad request: its message (what was wrong, how to fix it) goes back as JSON."""

    def __init__(self, message: str, status: int = 422) -> None:
        super().__init__(message)
        self.status = status


# ----------------------------------------------------------------------------- summary


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


# ----------------------------------------------------------------------------- HTTP plumbing


def _describe(errors: Sequence[Any]) -> tuple[str, list[dict[str, Any]]]:
    """A one-line summary and a JSON-safe list of pydantic errors (inputs not echoed back)."""
    detail = [
        {"loc": [str(p) for p in e.get("loc", ())], "msg": str(e.get("msg", "")),
         "type": str(e.get("type", ""))}
        for e in errors
    ]
    parts = [
        "body is not valid JSON" if d["type"] == "json_invalid"
        else f"{'.'.join(d['loc'][1:]) or 'body'}: {d['msg']}"
        for d in detail
    ]
    return "invalid request: " + "; ".join(parts), detail


async def _unreadable(request: Any) -> str:
    """Why a body FastAPI could not parse is unreadable, where it is not UTF-8 (JSON must
    be); else nothing."""
    try:
        (await request.body()).decode("utf-8")
    except UnicodeDecodeError as err:
        return (f": byte {err.start} of the body (0x{err.object[err.start]:02x}) is not "
                "UTF-8; send JSON encoded as UTF-8")
    except RuntimeError:  # the body was read already and is gone
        pass
    return ""


def _body_hint(content_type: str | None) -> str:
    """What to send instead of a body that is no JSON object. The usual cause: `curl -d`
    without `-H`, which sends application/x-www-form-urlencoded, so nothing parses as JSON."""
    if content_type is None or not content_type.startswith("application/json"):
        return (f"; the body must be JSON sent with Content-Type: application/json (this one "
                f"came as {content_type!r}; with curl: -H 'Content-Type: application/json')")
    return '; send a JSON object, e.g. {"text": "..."}'


def _sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


def _encode(tokenizer: TextTokenizer, text: str, max_chars: int) -> list[int]:
    if len(text) > max_chars:
        raise RequestError(f"text has {len(text)} characters; the limit is {max_chars}")
    try:
        ids = list(tokenizer.encode(text))
    except ValueError as err:  # a character the vocabulary lacks: the tokenizer says which
        raise RequestError(str(err)) from None
    if not ids:
        raise RequestError("text is empty: type at least one character")
    return ids


def _checked_ids(ids: list[int], vocab_size: int) -> list[int]:
    if not ids:
        raise RequestError("ids is empty: send at least one token id")
    bad = [i for i in ids if not 0 <= i < vocab_size]
    if bad:
        raise RequestError(f"token ids {bad[:5]} are outside the vocabulary [0, {vocab_size})")
    return ids


def _check_length(ids: list[int], block_size: int) -> None:
    """Reject more than block_size tokens."""
    if len(ids) > block_size:
        raise RequestError(
            f"the text is {len(ids)} tokens; the model sees at most block_size={block_size}: "
            f"shorten it to {block_size} tokens"
        )


async def _stream_events(
    step: Callable[[], Awaitable[int | None]],
    tokenizer: TextTokenizer,
    ids: list[int],
    stop_ids: Sequence[int],
    reason: str,
    disconnected: Callable[[], Awaitable[bool]],
) -> AsyncIterator[bytes]:
    """SSE events of one generation: `start` {prompt_ids} (so that a client that stops
    early can show the ids it got), `token` {id, text} per token, then `done` or `error`.

    `text` is what the new token adds to the decoded text; it is held back while the text
    ends in an incomplete character (a byte-level BPE token can be half of one).
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


def create_app(
    model: GPT,
    tokenizer: TextTokenizer,
    meta: dict[str, Any] | None = None,
    config: ServeConfig | None = None,
) -> "FastAPI":
    """The viewer's ASGI app for `model` (put in eval mode) and its `tokenizer`.

    meta: what the page shows as the training summary (a checkpoint's meta).
    """
    try:
        from fastapi import FastAPI, Request
        from fastapi.exceptions import RequestValidationError
        from fastapi.responses import FileResponse, JSONResponse, Response, StreamingResponse
        from pydantic import BaseModel, ConfigDict, Field, StrictBool
        from starlette.concurrency import run_in_threadpool
        from starlette.exceptions import HTTPException
    except ImportError as err:
        raise ImportError(
            f"the attention viewer needs FastAPI and uvicorn ({err.name} is missing); "
            "install them with: pip install 'attnlab[serve]'"
        ) from err

    limits = config or ServeConfig()
    c = model.config
    check_fits(tokenizer, c.vocab_size)
    model.eval()
    stop_ids = tuple(getattr(tokenizer, "stop_ids", ()))
    model_lock = threading.Lock()  # one forward at a time: torch already uses every core
    static_files = {p.name: p for p in WEB_DIR.iterdir() if p.suffix in _CONTENT_TYPES}
    summary = model_summary(model, tokenizer, meta, limits)

    class AttentionRequest(BaseModel):
        """Exactly one of `text` (tokenized here) or `ids` (e.g. a generation's tokens)."""

        model_config = ConfigDict(extra="forbid")
        text: str | None = Field(None, description="text to tokenize and run")
        ids: list[int] | None = Field(None, description="token ids to run instead of text")
        layers: list[int] | None = Field(None, description="layers to return (default: all)")
        norms: StrictBool = Field(  # "yes" or 1 read as true would hide a typo
            False, description="also return per-token L2 norms of q, k, v")
        encoding: Literal["lists", "float32"] = Field(
            "lists", description="lists: each head's rows as numbers rounded to 5 decimals; "
            "float32: each head as one base64 string of little-endian float32, the rows of "
            "the lower triangle one after another (exact, and faster for long texts)")

    class GenerateRequest(BaseModel):
        model_config = ConfigDict(extra="forbid")
        text: str = Field(description="the prompt (at least one token)")
        max_new_tokens: int = Field(
            64, ge=1, le=limits.max_new_tokens,
            description="tokens to generate; stops early when the context is full",
        )
        temperature: float = Field(
            1.0, ge=0.0, le=5.0, allow_inf_nan=False, description="0: most likely token"
        )
        top_k: int | None = Field(
            None, ge=1, le=c.vocab_size, description="sample among the k most likely tokens"
        )
        top_p: float | None = Field(
            None, gt=0.0, le=1.0, allow_inf_nan=False, description="nucleus: smallest set of mass p"
        )
        # at most 2**53 - 1: the largest integer JavaScript (the page, /docs) holds exactly
        seed: int | None = Field(None, ge=0, le=2**53 - 1, description="same seed, same tokens")

    class LayerAttention(BaseModel):
        layer: int
        heads: list[list[list[float]]] | list[str] = Field(
            description="(nh, T, i + 1): row i holds the weights of query i on keys 0..i; the "
            "causal mask makes every weight on a later key exactly 0, so those are left out "
            "(encoding float32: one base64 string per head)"
        )
        future_max: float = Field(description="largest weight on a later key (0.0: causal)")
        window: int | None = Field(
            description="sliding window: query i sees keys i - window < j <= i; the weights "
            "on earlier keys are masked, exactly 0 (null: no window in this layer)"
        )
        norms: dict[str, list[list[float]]] | None = Field(
            None, description="q (nh, T), k and v (nkv, T): L2 norm of each token's vector"
        )

    class AttentionResponse(BaseModel):
        tokens: list[dict[str, Any]] = Field(description="[{id, text}] one per token")
        n_head: int
        layers: list[LayerAttention]

    class ErrorResponse(BaseModel):
        error: str = Field(description="what was wrong and how to fix it")
        detail: list[dict[str, Any]] = Field(default_factory=list)

    app = FastAPI(
        title="attnlab attention viewer",
        version="1",
        description="Attention weights and streaming generation for one causal LM.",
        responses={422: {"model": ErrorResponse}},
        # FastAPI's /docs loads Swagger UI from a CDN and is blank offline; web/docs.html
        # renders /openapi.json with the package's own files instead
        docs_url=None, redoc_url=None,
    )

    def error(message: str, status: int) -> JSONResponse:
        return JSONResponse({"error": message, "detail": []}, status_code=status)

    @app.exception_handler(RequestError)
    async def request_error(request: Request, exc: RequestError) -> JSONResponse:
        return error(str(exc), exc.status)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        message = str(exc.detail)
        if exc.status_code == 400:  # FastAPI could not read the body: say why where we can
            message += await _unreadable(request)
        return error(message, exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, detail = _describe(exc.errors())
        if [d["loc"] for d in detail] == [["body"]]:  # no JSON object arrived at all
            message += _body_hint(request.headers.get("content-type"))
        return JSONResponse({"error": message, "detail": detail}, status_code=422)

    async def locked(fn: Callable[[], Any]) -> Any:
        def call() -> Any:
            with model_lock:
                try:
                    return fn()
                finally:
                    # runtime keeps a trace's freed (nh, T, T) buffers for a later one of the
                    # same size; texts of every length would pile them up to 2 GiB of RSS
                    # (256 MB -> 1.6 GB over 300 requests, 2-layer model, 20-800 tokens)
                    release_kept_memory()

        return await run_in_threadpool(call)

    page_headers = {"Content-Security-Policy": _CSP, "X-Content-Type-Options": "nosniff"}

    @app.get("/", include_in_schema=False)
    async def index() -> FileResponse:
        return FileResponse(
            static_files["index.html"], media_type=_CONTENT_TYPES[".html"], headers=page_headers
        )

    @app.get("/docs", include_in_schema=False)
    async def docs() -> FileResponse:
        return FileResponse(
            static_files["docs.html"], media_type=_CONTENT_TYPES[".html"], headers=page_headers
        )

    @app.get("/static/{name}", include_in_schema=False)
    async def static(name: str) -> FileResponse:
        # Only files listed at startup, by exact name: no path is ever joined from the URL.
        path = static_files.get(name)
        if path is None:
            raise HTTPException(404, f"no static file {name!r}")
        return FileResponse(path, media_type=_CONTENT_TYPES[path.suffix], headers=page_headers)

    @app.get("/api/model")
    async def model_info() -> dict[str, Any]:
        """Model config, parameter count, tokenizer, training summary and request limits."""
        return summary

    @app.post("/api/attention", response_model=AttentionResponse)
    async def attention(body: AttentionRequest) -> Response:
        """Tokens and per-layer, per-head attention weights (lower triangle) of one text."""
        if (body.text is None) == (body.ids is None):
            raise RequestError("send exactly one of 'text' or 'ids'")
        if body.ids is not None:
            ids = _checked_ids(body.ids, c.vocab_size)
        else:
            ids = _encode(tokenizer, body.text or "", limits.max_text_chars)
        _check_length(ids, c.block_size)
        if body.layers is not None and (
            not body.layers or any(not 0 <= i < c.n_layer for i in body.layers)
        ):
            raise RequestError(
                f"layers {body.layers} must be a non-empty list of layer indices in "
                f"[0, {c.n_layer})"
            )
        n_layers = c.n_layer if body.layers is None else len(set(body.layers))
        n_weights = n_layers * c.n_head * len(ids) * (len(ids) + 1) // 2
        if n_weights > limits.max_weights:
            raise RequestError(
                f"{n_layers} layers x {c.n_head} heads at {len(ids)} tokens are {n_weights} "
                f"weights, over the limit of {limits.max_weights}; ask for fewer layers, "
                'e.g. "layers": [0]'
            )
        payload = await locked(
            lambda: attention_payload(
                model, ids, tokenizer, layers=body.layers, norms=body.norms,
                decimals=limits.decimals, encoding=body.encoding,
            )
        )
        # json.dumps directly: FastAPI's encoder walks every float and is ~10x slower here
        return Response(json.dumps(payload), media_type="application/json")

    @app.post(
        "/api/generate",
        response_class=StreamingResponse,
        responses={200: {"content": {"text/event-stream": {}},
                         "description": "events `start` {prompt_ids}, `token` {id, text} "
                                        "per token, then `done` or `error`"}},
    )
    async def generate(body: GenerateRequest, request: Request) -> StreamingResponse:
        """Stream new tokens as server-sent events: `start`, `token` per token, then `done`."""
        ids = _encode(tokenizer, body.text, limits.max_text_chars)
        _check_length(ids, c.block_size)
        # a generation stops when the context is full: positions past block_size have no
        # embedding. The last new token is never fed back, so block_size - P + 1 fit (as in
        # `attnlab generate`); the page shows the attention of the first block_size tokens
        new_tokens = min(body.max_new_tokens, c.block_size - len(ids) + 1)
        reason = "max_new_tokens" if new_tokens == body.max_new_tokens else "block_size"
        stream = token_stream(
            model, ids, max_new_tokens=new_tokens, temperature=body.temperature,
            top_k=body.top_k, top_p=body.top_p, seed=body.seed, eot_ids=stop_ids,
            vocab_size=tokenizer.vocab_size,  # a larger model vocabulary has ids it cannot decode
            unused_ids=sorted(getattr(tokenizer, "unused_ids", ())),
        )

        async def events() -> AsyncIterator[bytes]:
            try:
                async for event in _stream_events(
                    lambda: locked(lambda: next(stream, None)), tokenizer, ids, stop_ids,
                    reason, request.is_disconnected,
                ):
                    yield event
            finally:
                close = getattr(stream, "close", None)
                if close is not None:
                    close()

        return StreamingResponse(
            events(), media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    from .interventions import add_routes

    add_routes(app, model, tokenizer, locked, limits.max_text_chars)  # /api/heads, /api/lens
    app.add_middleware(BodyLimit, max_bytes=limits.max_body_bytes)
    return app
