"""How a command's files reach its --out directory together: written into a hidden stage in
it, then moved in at the end with a Ctrl-C held over the moves (`written_together`), so a
run stopped halfway leaves --out as the last finished run left it. `heads`, `lens` and
`patch` write a JSON and its figure this way (`add_out_argument`, `write_json_and_figure`: a
Ctrl-C while the figure was drawn left the new JSON beside the earlier run's figure).
`attnlab inspect`'s files, whose set changes from run to run, share its `staging` and are
moved in by inspect_files.py; a checkpoint's are checkpoint.py's."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .common import interrupts_held

if TYPE_CHECKING:
    from matplotlib.figure import Figure


@contextlib.contextmanager
def staging(out: Path, command: str) -> Iterator[Path]:
    """A hidden directory in `out` (made if missing) that a run of `command` writes its files
    into, removed however the run ends: a run stopped halfway (Ctrl-C) leaves none of its
    files in `out`, which stays as the last finished run left it. A stage that a killed run
    left (SIGKILL: nothing runs) is removed by the next run into `out`."""
    made = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    for left in out.glob(f".{command}-*-*"):
        pid = left.name.split("-")[1]
        if pid.isdigit() and not process_alive(int(pid)):
            shutil.rmtree(left, ignore_errors=True)
    # in out, for os.replace to move (a rename); the pid names the run, for the tidy above
    stage = Path(tempfile.mkdtemp(prefix=f".{command}-{os.getpid()}-", dir=out))
    try:
        yield stage
    finally:
        shutil.rmtree(stage, ignore_errors=True)
        if made and not any(out.iterdir()):  # a failed first run leaves no empty directory
            out.rmdir()


@contextlib.contextmanager
def written_together(out: Path, command: str,
                     replacing: Callable[[Path], Iterable[str]] | None = None) -> Iterator[Path]:
    """A `staging` directory to write the files of `command` into; when the block ends
    without an error they are moved into `out`, replacing the files of the same names.
    `replacing(out)`: the names in `out` of the set the new files replace (an earlier
    export's shards), removed in the same held moment unless the stage brings them."""
    with staging(out, command) as stage:
        yield stage
        with interrupts_held():  # all of them or none: a few renames
            new = {path.name for path in stage.iterdir()}
            for name in sorted(set(replacing(out) if replacing else ()) - new):
                (out / name).unlink(missing_ok=True)
            for path in sorted(stage.iterdir()):
                os.replace(path, out / path.name)


def add_out_argument(parser: argparse.ArgumentParser, command: str) -> None:
    """--out of a command whose JSON and figure `write_json_and_figure` writes (default
    ./`command`)."""
    parser.add_argument("--out", default=command,
                        help=f"directory for {command}.png and {command}.json "
                        f"(default: ./{command})")


def write_json_and_figure(out: Path, command: str, record: Any, figure: Figure) -> None:
    """`record` as `command`.json and `figure` as `command`.png, moved into `out` together,
    then one line naming them."""
    from ..viz import save_figure

    with written_together(out, command) as stage:  # not a new JSON beside an old figure
        (stage / f"{command}.json").write_text(json.dumps(record, indent=2) + "\n")
        paths = save_figure(figure, stage / f"{command}.png")
    print(f"wrote {out / f'{command}.json'} and "
          f"{', '.join(str(out / p.name) for p in paths)}")


def process_alive(pid: int) -> bool:
    """Whether process `pid` runs (or may: one of another user's is not ours to judge)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
