"""`attnlab cache`: the token cache's entries (train/token_cache.py: a text's ids with their
tokenizer, under $ATTNLAB_CACHE/data or ~/.cache/attnlab/data), listed or removed. The
library finds and removes them; this module chooses and prints."""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import datetime
from typing import Any

from ..model.memory import gb
from .common import CLIError, count

DAY_S = 86_400


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "cache",
        help="list the token cache (texts tokenized for training) or clear it",
        description="List the token cache's entries: each text `attnlab train --data` "
        "tokenized, with its tokenizer, size and when a run last read it ($ATTNLAB_CACHE/data, "
        "default ~/.cache/attnlab/data). A later run on a removed entry's text tokenizes it "
        "again (and trains its bpe again).",
    )
    parser.add_argument(
        "--clear", action="store_true",
        help="remove the entries listed: all, or with --older-than those unused for DAYS days "
        "(a run reading one meanwhile keeps its data; a write under way is kept)",
    )
    parser.add_argument("--older-than", type=float, metavar="DAYS",
                        help="only the entries no run has read for DAYS days (e.g. 30, 0.5)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead")
    return parser


def run(args: argparse.Namespace) -> int:
    from ..train.data import default_cache_dir
    from ..train.token_cache import cache_entries, removable, remove_entries

    if args.older_than is not None and not args.older_than >= 0:
        raise CLIError(f"--older-than {args.older_than}: give a number of days, 0 or more")
    root, now = default_cache_dir(), time.time()
    entries = cache_entries(root)
    if args.older_than is not None:
        entries = [e for e in entries if now - e.last_used > args.older_than * DAY_S]
    if not args.clear:
        if args.json:
            print(json.dumps({"path": str(root / "data"),
                              "entries": [_as_dict(e) for e in entries]}, indent=2))
        else:
            _print(root, entries, args.older_than)
        return 0
    chosen = [e for e in entries if removable(e, now)]
    failed = remove_entries(root, chosen)
    for path, err in failed:
        print(f"attnlab cache: warning: {path} not removed: {err}", file=sys.stderr)
    gone = [e for e in chosen if e.path not in {path for path, _ in failed}]
    kept = len(entries) - len(chosen)
    print(f"removed  {count(len(gone), 'entry', 'entries')}, {gb(sum(e.size for e in gone))}"
          f" from {root / 'data'}"
          + (f" ({count(kept, 'write')} under way kept)" if kept else ""))
    return 1 if failed else 0


def _print(root: Any, entries: list[Any], older_than: float | None) -> None:
    data = root / "data"
    days = "day" if older_than == 1 else "days"
    which = f" unused for {older_than:g} {days}" if older_than is not None else ""
    if not entries:
        print(f"cache    {data}: no entries{which}")
        return
    print(f"cache    {data}: {count(len(entries), 'entry', 'entries')}{which}, "
          f"{gb(sum(e.size for e in entries))}")
    print(f"{'last used':16}  {'size':>9}  {'tokens':>11}  {'tokenizer':12}  text")
    for e in entries:
        used = datetime.fromtimestamp(e.last_used).strftime("%Y-%m-%d %H:%M")
        tokens = f"{e.tokens:,}" if e.tokens is not None else ""
        tokenizer, text = e.tokenizer, e.source or "(not recorded: written by an older attnlab)"
        if e.unfinished:
            tokenizer, text = "", f"unfinished: {e.path.name} (a write cut short, or under way)"
        print(f"{used:16}  {gb(e.size):>9}  {tokens:>11}  {tokenizer:12}  {text}")
    print("clear    attnlab cache --clear (all), or --clear --older-than DAYS")


def _as_dict(e: Any) -> dict[str, Any]:
    return {"path": str(e.path), "size": e.size, "last_used":
            datetime.fromtimestamp(e.last_used).isoformat(timespec="seconds"),
            "tokenizer": e.tokenizer, "source": e.source, "tokens": e.tokens,
            "unfinished": e.unfinished}
