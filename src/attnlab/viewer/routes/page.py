"""GET /, /docs and /static/{name}: the viewer's page and API docs (`web/index.html`,
`web/docs.html`) and the files they load, served as they are (no build step).

Only files in `web/` at startup are served, by exact name: no path is ever joined from the
URL. The page works offline, so its Content-Security-Policy lets it load nothing but its own
files (no CDN, no fonts).
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse
from starlette.exceptions import HTTPException

WEB_DIR = Path(__file__).parents[1] / "web"
CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".png": "image/png",
    ".svg": "image/svg+xml",
}
CSP = "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'"
PAGE_HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff"}


def router() -> APIRouter:
    """The page, the API docs page and the files of `web/` (none in the OpenAPI schema)."""
    static_files = {p.name: p for p in WEB_DIR.iterdir() if p.suffix in CONTENT_TYPES}
    routes = APIRouter()

    def page(name: str) -> FileResponse:
        return FileResponse(static_files[name], media_type=CONTENT_TYPES[".html"],
                            headers=PAGE_HEADERS)

    @routes.get("/", include_in_schema=False)
    async def index() -> FileResponse:
        return page("index.html")

    @routes.get("/docs", include_in_schema=False)
    async def docs() -> FileResponse:
        return page("docs.html")

    @routes.get("/static/{name}", include_in_schema=False)
    async def static(name: str) -> FileResponse:
        path = static_files.get(name)
        if path is None:
            raise HTTPException(404, f"no static file {name!r}")
        return FileResponse(path, media_type=CONTENT_TYPES[path.suffix], headers=PAGE_HEADERS)

    return routes
