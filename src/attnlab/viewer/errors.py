"""The viewer's one error format: every bad request gets a 4xx JSON body
`{"error": "...", "detail": [...]}` (a request the device ran out of memory for, a 503), never a
500 and never FastAPI's own shape.

`add_error_handlers(app)` turns a route's `RequestError` (`state.py`), an HTTP error (404,
405, an unreadable body) and a failed validation of a request model into that body, saying
what to send instead where the cause is common. `create_app` imports this module (and with
it FastAPI) only when it builds an app.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException

from .state import RequestError


class ErrorResponse(BaseModel):
    error: str = Field(description="what was wrong and how to fix it")
    detail: list[dict[str, Any]] = Field(default_factory=list)


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


async def _unreadable(request: Request) -> str:
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


def _error(message: str, status: int) -> JSONResponse:
    return JSONResponse({"error": message, "detail": []}, status_code=status)


async def _request_error(request: Request, exc: RequestError) -> JSONResponse:
    return _error(str(exc), exc.status)


async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
    message = str(exc.detail)
    if exc.status_code == 400:  # FastAPI could not read the body: say why where we can
        message += await _unreadable(request)
    return _error(message, exc.status_code)


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    message, detail = _describe(exc.errors())
    if [d["loc"] for d in detail] == [["body"]]:  # no JSON object arrived at all
        message += _body_hint(request.headers.get("content-type"))
    return JSONResponse({"error": message, "detail": detail}, status_code=422)


def add_error_handlers(app: FastAPI) -> None:
    """Answer every error `app` raises in the viewer's JSON error format."""
    app.exception_handler(RequestError)(_request_error)
    app.exception_handler(HTTPException)(_http_error)
    app.exception_handler(RequestValidationError)(_validation_error)
