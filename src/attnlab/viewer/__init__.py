"""Attention you can look at: the HTTP viewer and the notebook view.

`app.py` builds the viewer's ASGI app (`create_app`) over the static page in `web/`,
`payloads.py` says what its answers hold, `interventions.py` adds the heads and lens routes,
`asgi.py` limits request bodies, and `notebook.py` is `attnlab.show()`: one self-contained
HTML view, inline in a notebook or saved.
"""

from .app import ServeConfig, create_app
from .notebook import View, show

__all__ = ["ServeConfig", "View", "create_app", "show"]
