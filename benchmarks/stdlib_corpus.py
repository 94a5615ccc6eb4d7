"""A second text corpus that every Python install has: the standard library's top-level
modules, in name order, concatenated up to 1.5 MB (docs/train.md: "Train for a time budget").

    python -m benchmarks.stdlib_corpus stdlib.txt

The text depends on the Python version (3.11.7 gave 52 modules, 1,467,351 characters).
"""

from __future__ import annotations

import sys
import sysconfig
from pathlib import Path

LIMIT = 1_500_000  # characters


def stdlib_text(limit: int = LIMIT) -> str:
    parts: list[str] = []
    size = 0
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        if size + len(text) > limit:
            break
        parts.append(text)
        size += len(text)
    return "".join(parts)


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0].startswith("-"):  # --help is not a file to write
        print("usage: python -m benchmarks.stdlib_corpus OUT.txt", file=sys.stderr)
        return 0 if argv in (["-h"], ["--help"]) else 2
    text = stdlib_text()
    Path(argv[0]).write_text(text, encoding="utf-8")
    print(f"wrote {len(text):,} characters of Python {sys.version.split()[0]}'s standard "
          f"library to {argv[0]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
