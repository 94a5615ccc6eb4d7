"""The files `attnlab inspect` writes into --out, and how they get there: a hidden stage a
stopped run leaves nothing of (outputs.py's `staging`), attention.json written a few query
rows at a time (`AttentionRecord`), and the move into --out that removes what an earlier run
there wrote and this one did not (`move_in`, `list_files`).

What to trace, the figures and the fit check are inspect.py's; this module only writes.

attention.json is the text `json.dumps(record)` gives for the whole record, byte for byte,
but never held whole: each head's weights are rounded and formatted `ROWS_BYTES` of float32
at a time, so its memory is a few rows of Python floats, not 30-odd bytes per weight
(docs/performance.md#inspect-memory).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from .common import count, interrupts_held

#: float32 bytes of a head's weights rounded and formatted at once: their Python floats and
#: text are about 12x that, so a few MB of a head, whatever the text's length
ROWS_BYTES = 256 * 1024


@dataclass
class AttentionRecord:
    """What attention.json holds: `fields` (the checkpoint, the text, its tokens and ids, the
    layers and heads, and "query_rows" of a row-only trace) and each chosen head's weights,
    `weights(layer, head)`: (T, S), or (len(rows), S) of the query rows a row-only trace kept.
    Weights are written as `viz.to_list` gives them: float32 rounded to 5 decimals."""

    fields: dict[str, Any]
    layers: list[int]
    heads: list[int]
    weights: Callable[[int, int], Any]  # (layer, head) -> tensor (R, S)

    def write(self, file: IO[bytes], files: list[str],
              progress: Callable[[int, int], None] | None = None) -> int:
        """Write the record with `"files": files` (the files of the run, for the next run to
        tidy) to `file`, as `json.dumps` of it all would; the offset of the "files" tail, for
        `rewrite_files`. progress: called as (heads written, heads) after each head's
        weights (a 1B model's 512 heads over 400 tokens: half a minute, 600 MB)."""
        head = json.dumps(self.fields)
        if not (self.fields and head.endswith("}")):
            raise ValueError(f"attention.json's fields must be a non-empty dict, got {head}")
        file.write(head[:-1].encode())  # left open: "attention" and "files" follow
        file.write(b', "attention": [')
        pairs = [(la, h) for la in self.layers for h in self.heads]
        for i, (la, h) in enumerate(pairs):
            # '{"layer": 0, "head": 1, "weights": ' as json.dumps spells it, then the rows
            opening = json.dumps({"layer": la, "head": h, "weights": []})[:-3]
            file.write(f"{', ' if i else ''}{opening}[".encode())
            self._write_weights(file, self.weights(la, h))
            file.write(b"]}")
            if progress is not None:
                progress(i + 1, len(pairs))
        file.write(b"]")
        tail_at = file.tell()
        file.write(files_tail(files))
        return tail_at

    def _write_weights(self, file: IO[bytes], weights: Any) -> None:
        """One head's (R, S) weights as json.dumps writes its nested list, without the outer
        brackets: a list of rows joined by ", " is those rows' lists joined by ", "."""
        from .. import viz

        weights = weights.float().cpu()  # (R, S): one head on the host (a view if it is)
        R, S = weights.shape
        step = max(1, ROWS_BYTES // (4 * S))  # query rows per piece
        for first in range(0, R, step):
            piece = json.dumps(viz.to_list(weights[first:first + step]))  # "[[...], [...]]"
            file.write((", " if first else "").encode() + piece[1:-1].encode())


FILES_KEY = b', "files": ['  # how attention.json's last key, the list of its files, opens


def files_tail(files: list[str]) -> bytes:
    """The end of attention.json: its "files" list (the last key) and the closing brace."""
    return f', "files": {json.dumps(sorted(files))}}}'.encode()


def rewrite_files(path: Path, to: Path, tail_at: int, files: list[str]) -> None:
    """Copy attention.json at `path` to `to` with another "files" list: its bytes up to
    `tail_at` (what `AttentionRecord.write` returned), then the new tail; nothing
    formatted again."""
    with path.open("rb") as source, to.open("wb") as target:
        left = tail_at
        while left:
            chunk = source.read(min(left, 1 << 20))
            if not chunk:
                raise ValueError(f"{path} ends at byte {tail_at - left}, before its 'files' "
                                 f"list at {tail_at}; was it changed while inspect ran?")
            target.write(chunk)
            left -= len(chunk)
        target.write(files_tail(files))


def move_in(out: Path, stage: Path, record: AttentionRecord, names: list[str],
            progress: Callable[[int, int], None] | None = None
            ) -> tuple[list[Path], set[str]]:
    """Move the files `names` from `stage` into `out` with attention.json (the record, and the
    files of this run), and remove the files an earlier inspect there wrote that this one did
    not: (the files now in `out`, the names removed). progress: `AttentionRecord.write`'s."""
    json_path = out / "attention.json"
    staged = stage / json_path.name
    stale = earlier_files(json_path) - set(names) - {json_path.name}
    # attention.json lists the earlier files too until they are gone: a run stopped between
    # two moves leaves a list of every file the next run into `out` must remove
    with staged.open("wb") as file:
        tail_at = record.write(file, sorted(set(names) | stale), progress)
    with interrupts_held():  # a few renames: the new set whole before a Ctrl-C lands
        os.replace(staged, json_path)
        for name in names:
            os.replace(stage / name, out / name)
        for name in sorted(stale):
            (out / name).unlink(missing_ok=True)
    if stale:  # the same record, listing this run's files alone
        rewrite_files(json_path, staged, tail_at, sorted(names))
        os.replace(staged, json_path)
    return [out / name for name in names] + [json_path], stale


def list_files(out: Path, written: list[Path], stale: set[str]) -> None:
    """Print the files a run wrote to `out` (the first 12) and how many earlier ones went."""
    print(f"wrote    {count(len(written), 'file')} to {out}/")
    for path in written[:12]:
        print(f"         {path.name}")
    if len(written) > 12:
        print(f"         … and {len(written) - 12} more")
    if stale:
        print(f"removed  {len(stale)} files an earlier inspect wrote to {out}/ "
              "(figures of another text or selection)")


def earlier_files(json_path: Path) -> set[str]:
    """The files an earlier `inspect` into the same directory wrote (its attention.json
    lists them, last); names only, so nothing outside the directory is ever touched. Read
    from the file's end: the weights before the list are not parsed (a long text's
    attention.json is gigabytes of them)."""
    try:
        with json_path.open("rb") as file:
            size = file.seek(0, os.SEEK_END)
            tail = b""
            for span in (1 << 16, 1 << 20, 1 << 24):  # most lists fit the first
                file.seek(max(0, size - span))
                tail = file.read(span)
                # a quote inside a JSON string is escaped (\"): this is the top-level key
                at = tail.rfind(FILES_KEY)
                if at >= 0 or span >= size:
                    break
        files = json.loads(tail[at + len(FILES_KEY) - 1:].rstrip()[:-1]) if at >= 0 else []
    except (OSError, ValueError):
        return set()
    if not isinstance(files, list):
        return set()
    return {f for f in files if isinstance(f, str) and f == Path(f).name}
