"""The README's cheap commands, run as written in a fresh directory (a minute or two: most
of it is the copy task's training, which the later commands use).

Commands are taken from the README's ```bash blocks; only those on the CHEAP list run (a
new README command costs nothing here until someone adds it), and every CHEAP command must
still be in the README, so the list cannot silently drift from it. The rest (tiny
Shakespeare training, torchrun, GPT-2 downloads, serve, full benchmarks) are walked by hand.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"

# in README order: later commands use what earlier ones made (runs/copy)
CHEAP = [
    "attnlab train",
    "attnlab train --data copy --out runs/copy --resume",
    'attnlab generate runs/copy/ckpt "abcdefgh|" --max-new-tokens 8 --temperature 0',
    'attnlab inspect runs/copy/ckpt "qhdkwzpa|qhdkwzp" --out inspect',
    "attnlab demo hello",
    "attnlab demo averaging",
    "attnlab heads runs/copy/ckpt",
    'attnlab patch runs/copy/ckpt --clean "qhdkwzpa|qhd" --corrupt "qhdswzpa|qhd" --answer k '
    "--wrong s",
    'attnlab lens runs/copy/ckpt "qhdkwzpa|qhdk"',
    'attnlab generate runs/copy/ckpt "qhdkwzpa|" --temperature 0 --ablate 0.0,0.1,0.2,0.3',
]


def readme_commands(text: str) -> list[str]:
    """Every command of the README's bash blocks, comments dropped, continuations joined."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            command = re.sub(r"\s+#.*$", "", line).strip()  # a trailing "# comment"
            if command and not command.startswith("#"):
                commands.append(" ".join(command.split()))
    return commands


def test_every_cheap_command_is_in_the_readme() -> None:
    commands = readme_commands(README.read_text())
    in_readme_order = list(dict.fromkeys(c for c in commands if c in CHEAP))
    assert in_readme_order == [c for c in CHEAP if c in commands]
    missing = [c for c in CHEAP if c not in commands]
    assert missing == [], f"README no longer has {missing}; update CHEAP"


def test_readme_commands_run_as_written(tmp_path: Path) -> None:
    (tmp_path / "shared").symlink_to(ROOT.parent / "shared", target_is_directory=True)
    cwd = tmp_path / "work"
    cwd.mkdir()
    env = {**os.environ, "ATTNLAB_CACHE": str(tmp_path / "cache"),
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    outputs = {}
    for command in CHEAP:
        # `attnlab` as the console script would run it, from this checkout's sources
        script = f'attnlab() {{ "{sys.executable}" -m attnlab "$@"; }}\n{command}\n'
        done = subprocess.run(["bash", "-c", script], cwd=cwd, env=env, text=True,
                              capture_output=True, timeout=300)
        assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr}"
        outputs[command] = done.stdout
    assert "after    answer accuracy" in outputs["attnlab train"]
    assert "nothing to resume" in outputs[CHEAP[1]]
    assert outputs[CHEAP[2]].startswith("abcdefgh|")
    assert "wrote    18 files to inspect/" in outputs[CHEAP[3]]
    assert "induction" in outputs["attnlab heads runs/copy/ckpt"]
    assert "logit difference 'k' - 's'" in outputs[CHEAP[7]]
    assert "layer 1" in outputs[CHEAP[8]]
    assert outputs[CHEAP[9]].startswith("qhdkwzpa|")


def test_the_readme_extractor_reads_continuations_and_comments() -> None:
    text = "```bash\nattnlab train   # the copy task\n# a note\ntorchrun a \\\n  -m b\n```\n"
    assert readme_commands(text) == ["attnlab train", "torchrun a -m b"]


@pytest.mark.parametrize("command", CHEAP)
def test_cheap_commands_are_attnlab_commands(command: str) -> None:
    assert command.startswith("attnlab ")  # nothing here installs, downloads or serves


def test_layout_names_every_module() -> None:
    """The README's Layout table names every module of the package (a new module, or one
    split into a folder, shows up here until the table says what it owns)."""
    text = README.read_text(encoding="utf-8")
    layout = text[text.index("## Layout"):]
    layout = layout[:layout.find("\n## ", 1) if "\n## " in layout[1:] else len(layout)]
    package = ROOT / "src" / "attnlab"
    names = [p.name for p in package.glob("*.py") if not p.name.startswith("__")]
    names += [f"{p.name}/" for p in package.iterdir() if p.is_dir() and p.name != "__pycache__"]
    names += [p.name for p in (package / "hf").glob("*.py") if not p.name.startswith("__")]
    missing = sorted(n for n in names if f"`{n}`" not in layout)
    assert not missing, f"README's Layout table does not name {missing}"


def test_the_quick_tour_snippet_runs_and_scores_the_next_token() -> None:
    """The Quick tour's first Python block runs as written, and its loss is the next-token
    loss: GPT.forward does not shift targets, so the snippet must (targets=idx would score
    predicting each position's own token)."""
    tour = README.read_text(encoding="utf-8").split("## Quick tour", 1)[1]
    snippet = re.findall(r"```python\n(.*?)```", tour, flags=re.S)[0]
    namespace: dict[str, Any] = {}
    exec(snippet, namespace)  # the README's own code
    ids, idx, targets = (namespace[n] for n in ("ids", "idx", "targets"))
    assert torch.equal(idx, ids[:, :-1]) and torch.equal(targets, ids[:, 1:])
    assert namespace["logits"].shape == (*idx.shape, 65)
    assert sorted(namespace["trace"]) == [(layer, "attn_weights") for layer in range(4)]
