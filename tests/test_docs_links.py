"""Every link between the project's pages holds: the README's and docs/'s relative links, and
the docs/<page>.md#<anchor> references in code, name a file that exists and a heading on it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).parents[1]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
CODE = sorted(p for d in ("src", "benchmarks", "tests") for p in (ROOT / d).rglob("*.py"))


def _prose(page: Path) -> str:
    """The page without its fenced code blocks (a # there is a comment, not a heading)."""
    return re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.S | re.M)


def anchor(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces to -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_anchor_follows_github() -> None:
    assert anchor("Trace on a GPU") == "trace-on-a-gpu"
    assert anchor("`attnlab train`: what it prints") == "attnlab-train-what-it-prints"


ANCHORS = {page.resolve(): {anchor(h) for h in re.findall(r"^#+\s+(.*)$", _prose(page), re.M)}
           for page in PAGES}


def _broken(target: Path, fragment: str) -> str | None:
    if not target.exists():
        return "no such file"
    if fragment and target.resolve() in ANCHORS and fragment not in ANCHORS[target.resolve()]:
        return f"no heading #{fragment}"
    return None


def test_a_missing_page_or_heading_is_caught() -> None:
    docs = ROOT / "docs"
    assert _broken(docs / "performance.md", "summaries-at-long-context") is None
    assert _broken(docs / "performance.md", "no-such-heading") == "no heading #no-such-heading"
    assert _broken(docs / "no-such-page.md", "") == "no such file"


def test_the_pages_links_hold() -> None:
    broken = []
    for page in PAGES:
        for link in re.findall(r"\]\(([^)\s]+)\)", _prose(page)):
            if re.match(r"[a-z]+:", link):  # http:, https:, mailto:
                continue
            path, _, fragment = link.partition("#")
            why = _broken(page.parent / path if path else page, fragment)
            if why:
                broken.append(f"{page.relative_to(ROOT)}: ({link}) {why}")
    assert not broken, "\n".join(broken)


def test_the_codes_references_to_the_docs_hold() -> None:
    broken = []
    for source in CODE:
        for path, fragment in re.findall(r"\bdocs/([\w/.-]+\.md)(?:#([\w-]+))?",
                                         source.read_text(encoding="utf-8")):
            why = _broken(ROOT / "docs" / path, fragment)
            if why:
                broken.append(f"{source.relative_to(ROOT)}: docs/{path}#{fragment} {why}")
    assert not broken, "\n".join(broken)
