"""One self-contained HTML fragment from the viewer's own web/ scripts and a data blob: what
`show()` returns (`View`), inline in a notebook or saved as a page.

A `Bundle` names some of web/'s ES modules and stylesheets; `fragment()` inlines them as one
classic script (imports and `export` dropped) and one `<style>`, with the data and the call
that mounts the bundle's entry function on the fragment's root: no CDN, no server, no
require.js, no network request, so it works offline in JupyterLab, Notebook 7, VS Code,
Colab and a plain browser. The page serves the same modules (`routes/page.py`), so the
page and a notebook draw with one renderer. Each fragment has a unique element id; a page
gets one global, `window.attnlabView`, which keeps each bundle's code once under the hash of
its text, so several views on a page (of one bundle or several, of one attnlab version or
two) share nothing else. What goes in the data is the caller's (`notebook.py`,
`summary_view.py`); drawing is the JavaScript's.
"""

from __future__ import annotations

import hashlib
import html
import json
import re
import uuid
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

WEB_DIR = Path(__file__).parent / "web"


@dataclass(frozen=True)
class Bundle:
    """Some of web/'s files as one view: ES modules that import nothing but each other (in
    an order where each follows what it imports), stylesheets, and the function they
    define that draws a view, `entry(root, data)`."""

    scripts: tuple[str, ...]
    styles: tuple[str, ...]
    entry: str


#: the attention view (`show()`): tabs of heatmaps and tokens, and a mixture of experts'
#: routing (the page's routing panel draws it too)
ATTENTION = Bundle(("draw.js", "chips.js", "view_data.js", "routing.js", "view.js"),
                   ("view.css", "routing.css"), "mount")
#: the heads overview (`show(..., summary=True)`): the page's heads panel draws it too
OVERVIEW = Bundle(("draw.js", "chips.js", "overview.js"), ("view.css", "overview.css"),
                  "mountOverview")


class View:
    """One view: `_repr_html_` for notebooks, `save()` for a file, `html` as text."""

    def __init__(self, fragment: str, title: str) -> None:
        self.html = fragment
        self.title = title

    def _repr_html_(self) -> str:
        return self.html

    @property
    def nbytes(self) -> int:
        """Size of the HTML fragment in bytes (UTF-8)."""
        return len(self.html.encode())

    def page(self) -> str:
        """The view as a whole HTML document."""
        return (
            '<!doctype html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
            '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            f"<title>{html.escape(self.title)}</title>\n</head>\n"
            f'<body style="margin: 16px">\n{self.html}\n</body>\n</html>\n'
        )

    def save(self, path: str | Path) -> Path:
        """Write the view as a standalone HTML file that opens with no network."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.page(), encoding="utf-8")
        return path

    def __repr__(self) -> str:
        return f"<attnlab View {self.title!r}: {self.nbytes / 1e6:.2f} MB of HTML>"


_IMPORT = re.compile(r"^import \{.*?\} from \"[^\"]+\";\n", re.M | re.S)
_EXPORT = re.compile(r"^export (?=(?:async )?function |const |let |class )", re.M)


def classic(source: str) -> str:
    """An ES module of top-level declarations as plain script text: imports and `export` go."""
    return _EXPORT.sub("", _IMPORT.sub("", source))


@lru_cache(maxsize=4)
def assets(bundle: Bundle) -> tuple[str, str, str]:
    """(script body defining the bundle's entry, css, version key) from the package's files."""
    js = "\n".join(classic((WEB_DIR / name).read_text()) for name in bundle.scripts)
    css = "\n".join((WEB_DIR / name).read_text() for name in bundle.styles)
    key = hashlib.sha256((js + css).encode()).hexdigest()[:12]
    return js, css, key


def fragment(bundle: Bundle, data: dict[str, Any], title: str | None = None) -> str:
    """The view as one HTML fragment: its styles, the data and the script that mounts it;
    a title given is its heading."""
    js, css, key = assets(bundle)
    uid = f"attnlab-view-{uuid.uuid4().hex[:12]}"
    blob = json.dumps(data, separators=(",", ":")).replace("<", "\\u003c")
    heading = "" if title is None else (
        f'<h3 style="margin:0 0 6px;font-family:sans-serif">{html.escape(title)}</h3>\n')
    return (
        f'<div class="attnlab-view" id="{uid}">\n{heading}<style>\n{css}</style>\n'
        '<div class="alv-app">attnlab view: it needs JavaScript (in Jupyter, trust the '
        "notebook: File &gt; Trust Notebook)</div>\n<script>\n(function () {\n"
        "const NS = (window.attnlabView = window.attnlabView || {});\n"
        f'if (!NS["{key}"]) NS["{key}"] = (function () {{\n{js}\nreturn {bundle.entry};\n}})();\n'
        "const me = document.currentScript;\n"
        f'const root = (me && me.closest(".attnlab-view")) || document.getElementById("{uid}");\n'
        f'NS["{key}"](root, {blob});\n}})();\n</script>\n</div>'
    )
