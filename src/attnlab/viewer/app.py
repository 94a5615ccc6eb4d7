"""The attention viewer: an HTTP API over one model and the static page in `web/`.

`create_app(model, tokenizer, meta)` returns an ASGI app (FastAPI) with
    GET  /                 the page (web/index.html; web/app.js and web/style.css under /static/)
    GET  /api/model        config, parameter count, tokenizer, training summary, limits
    POST /api/attention    {text | ids, layers?, norms?} -> tokens and attention weights
    POST /api/generate     {text, max_new_tokens, temperature, top_k, top_p, min_p, typical_p,
                            repetition_penalty, no_repeat_ngram_size, seed} -> SSE stream
    POST /api/heads        {text, ablate?} -> head detector scores, next token with heads ablated
    POST /api/lens         {text} -> logit lens: top tokens after each layer
    POST /api/routing      {text | ids, layers?} -> a mixture of experts' routing per layer
    GET  /openapi.json     the schema (FastAPI); GET /docs renders it (web/docs.html, offline)
This module assembles the app: the error format (`errors.py`), one router per group of
routes (`routes/`: page, attention, generate, interventions, routing) over the state they share
(`state.py`: limits, request checks, the model lock), and the request-body limit
(`asgi.py`). What the answers hold is `payloads.py`'s; the model math is `model/`'s, the
sampling `generate/`'s, and the drawing the page's (`web/app.js`). Starting a server
(uvicorn) is `cli/serve.py`'s job.

Every bad request gets a 4xx JSON body `{"error": "...", "detail": [...]}`, never a 500; a
request the device has no memory for gets a 503 in the same format, naming the limits to lower
(`state.ViewerState.out_of_memory`), and the server goes on serving.
Model calls run in a worker thread, one at a time behind a lock, in the order they came (a
generation takes the lock per token, so attention requests interleave with a long
generation); a request whose client left while it waited is dropped, not computed, and one
whose client leaves while it computes stops before the model's next block. Setting
`stopping` (`attnlab serve` does on Ctrl-C) stops the call under way before its next block,
ends every generation with an `error` event and answers waiting requests with a 503, so a
server stops within one block (or one decoded token).

FastAPI and pydantic (the `serve` extra) are imported inside `create_app`, with the modules
that need them (`errors.py`, `routes/`), so importing this module, and `attnlab --help`,
work without them.
"""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING, Any, cast

from ..model.gpt import GPT
from .asgi import BodyLimit
from .payloads import TextTokenizer, attention_payload
from .state import RequestError, ServeConfig, ViewerState, model_summary

__all__ = ["RequestError", "ServeConfig", "TextTokenizer", "attention_payload", "create_app",
           "model_summary"]

if TYPE_CHECKING:
    from fastapi import FastAPI


def _require_serve_extra() -> None:
    """Raise an ImportError that names the install command when the serve extra is missing."""
    try:
        import fastapi  # noqa: F401
        import pydantic  # noqa: F401
        import starlette  # noqa: F401
    except ImportError as err:
        raise ImportError(
            f"the attention viewer needs FastAPI and uvicorn ({err.name} is missing); "
            "install them with: pip install 'attnlab[serve]'"
        ) from err


def create_app(
    model: GPT,
    tokenizer: TextTokenizer,
    meta: dict[str, Any] | None = None,
    config: ServeConfig | None = None,
    stopping: threading.Event | None = None,
) -> FastAPI:
    """The viewer's ASGI app for `model` (put in eval mode) and its `tokenizer`.

    meta: what the page shows as the training summary (a checkpoint's meta).
    stopping: set it when the server begins to stop, so that the model call under way ends
    before its next block and open generations end at once, rather than run to their end
    (max_new_tokens) while the server waits for them.
    """
    _require_serve_extra()
    from fastapi import FastAPI

    from .errors import ErrorResponse, add_error_handlers
    from .routes import attention, generate, interventions, page, routing

    state = ViewerState.of(model, tokenizer, meta, config or ServeConfig(), stopping)
    app = FastAPI(
        title="attnlab attention viewer",
        version="1",
        description="Attention weights and streaming generation for one causal LM.",
        responses={422: {"model": ErrorResponse}},
        # FastAPI's /docs loads Swagger UI from a CDN and is blank offline; web/docs.html
        # renders /openapi.json with the package's own files instead
        docs_url=None, redoc_url=None,
    )
    add_error_handlers(app)
    # The app holds its state; its routes reach it through a weak proxy, because FastAPI
    # caches endpoint callables (up to 4,096, module-wide) and would otherwise keep every
    # dropped app's model alive: a notebook that serves model after model held them all.
    app.state.viewer = state
    shared = cast(ViewerState, weakref.proxy(state))
    app.include_router(page.router())
    app.include_router(attention.router(shared))
    app.include_router(generate.router(shared))
    app.include_router(interventions.router(shared))
    app.include_router(routing.router(shared))
    app.add_middleware(BodyLimit, max_bytes=state.limits.max_body_bytes)
    return app
