"""Attention you can look at: the HTTP viewer and the notebook view.

`app.py` builds the viewer's ASGI app (`create_app`) over the static page in `web/`: its
routes are in `routes/` (the page, /api/model and /api/attention, /api/generate, /api/heads
and /api/lens), what they share in `state.py`, the error format in `errors.py`, and the
request-body limit in `asgi.py`. `payloads.py` says what the answers hold, and `notebook.py`
is `attnlab.show()` (its heads overview `summary_view.py`'s): one self-contained HTML view
(`fragment.py`'s `View`) of the page's own scripts, inline in a notebook or saved.
"""

from .app import ServeConfig, create_app
from .fragment import View
from .notebook import show

__all__ = ["ServeConfig", "View", "create_app", "show"]
