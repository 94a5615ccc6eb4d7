"""The README's and docs/*.md's cheap commands and Python blocks, run as written in a fresh
directory (a few minutes on 2 cores: most of it is the copy task's training and starting
Python for each command).

The README's main command, `attnlab train`, trains the copy model once; every page then runs
in a directory of its own holding a copy of that run (`runs/copy`), going through its
```bash and ```python blocks in page order. A command runs only when it is on the page's
CHEAP list (a new command costs nothing here until someone adds it), and every CHEAP
command must still be on its page, in page order, so the lists cannot silently drift from
the pages. A Python block runs unless the page's SLOW list names a line of it, with the
reason; each SLOW line must be in exactly one block. The blocks of one page share one
namespace, as in a notebook. What is left out (tiny Shakespeare training, torchrun, hub
downloads, serve, full benchmarks) is walked by hand.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
MAIN = "attnlab train"  # the README's main command: the copy run every page starts from
INSTALL = 'pip install "torch==2.13.0" -e ".[dev]"'
TESTS = "python -m pytest"

# page -> [(command, what its stdout must hold)], in page order; later commands of a page
# may use what earlier ones made
CHEAP: dict[str, list[tuple[str, str]]] = {
    "README.md": [
        ("attnlab train --data copy --out runs/copy --resume", "nothing to resume"),
        ('attnlab generate runs/copy/ckpt "abcdefgh|" --max-new-tokens 8 --temperature 0',
         "abcdefgh|abcdefgh"),
        ('attnlab inspect runs/copy/ckpt "qhdkwzpa|qhdkwzp" --out inspect',
         "wrote    18 files to inspect/"),
        ("attnlab heads runs/copy/ckpt", "induction"),
        ('attnlab generate runs/copy/ckpt "qhdkwzpa|" --temperature 0 --ablate 0.0,0.1,0.2,0.3',
         "qhdkwzpa|"),
    ],
    "docs/train.md": [
        ("attnlab info runs/copy", "trained     600 steps on copy"),
    ],
    "docs/models.md": [
        ("attnlab export runs/copy/ckpt copy-hf", "as GPT2LMHeadModel (gpt2)"),
        ("attnlab info copy-hf", "family      GPT2LMHeadModel"),
        ('attnlab generate copy-hf "abcdefgh|" --max-new-tokens 8 --temperature 0',
         "abcdefgh|abcdefgh"),
    ],
    "docs/inspect.md": [
        ('attnlab inspect runs/copy/ckpt "qhdkwzpa|qhdkwzp" --what steps --layer 0 --head 0 '
         "--format html,png --out inspect-steps", "to inspect-steps/"),
        ('attnlab inspect runs/copy/ckpt "qhdkwzpa|qhdkwzp" --summary --out inspect-summary',
         "most weight on the first token"),
        ("attnlab demo hello", "'Hello' -> ' World' (p=1.000)  ✓"),
        ("attnlab demo averaging", "found    the three forms agree"),
    ],
    "docs/interventions.md": [
        ('attnlab patch runs/copy/ckpt --clean "qhdkwzpa|qhd" --corrupt "qhdswzpa|qhd" '
         "--answer k --wrong s", "logit difference 'k' - 's'"),
        ('attnlab lens runs/copy/ckpt "qhdkwzpa|qhdk"', "layer 1"),
        ('attnlab patch runs/copy/ckpt --clean "qhdkwzpa|qhd" --corrupt "qhdswzpa|qhd" '
         "--answer k --wrong s --blocks --out patch-blocks", "MLP output of layer 1: "),
        ('attnlab lens runs/copy/ckpt "qhdkwzpa|qhdk" --mid --out lens-mid', "layer 1 attn"),
        ('attnlab patch runs/copy/ckpt --clean "qhdkwzpa|qhd" --corrupt "qhdswzpa|qhd" '
         "--answer k --wrong s --qkv --out patch-qkv", "  through values: "),
        ('attnlab patch runs/copy/ckpt --clean "qhdkwzpa|qhd" --corrupt "qhdswzpa|qhd" '
         "--answer k --wrong s --paths-to logits --out patch-paths", "paths to the logits: "),
    ],
}

# page -> {a line of a Python block that is not run: why}
SLOW: dict[str, dict[str, str]] = {
    "docs/generate.md": {
        'ckpt = load_checkpoint("runs/tinyshakespeare/ckpt")':
            "needs the tiny Shakespeare run (about a minute of training)",
    },
    "docs/models.md": {
        'model = load_hf("smollm")': "needs SmolLM-135M from the Hugging Face hub",
        'model = load_hf("llama-hf")': "needs the 150-step Llama run on tiny Shakespeare",
    },
}


def page_name(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of every ```bash and ```python block, in page order."""
    return re.findall(r"```(bash|python)\n(.*?)```", text, flags=re.S)


def commands_of(block: str) -> list[str]:
    """Every command of a bash block, comments dropped, continuations joined."""
    commands = []
    for line in block.replace("\\\n", " ").splitlines():
        command = re.sub(r"\s+#.*$", "", line).strip()  # a trailing "# comment"
        if command and not command.startswith("#"):
            commands.append(" ".join(command.split()))
    return commands


def page_commands(text: str) -> list[str]:
    return [c for lang, body in blocks(text) if lang == "bash" for c in commands_of(body)]


@pytest.fixture(scope="module")
def copy_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A directory where the README's main command has run, and what it printed."""
    cwd = tmp_path_factory.mktemp("main") / "work"
    cwd.mkdir()
    return cwd, run_command(MAIN, cwd, tmp_path_factory.getbasetemp() / "cache")


def run_command(command: str, cwd: Path, cache: Path) -> str:
    """`command` in bash in `cwd`, `attnlab` run as the console script would from this
    checkout's sources; its stdout."""
    env = {**os.environ, "ATTNLAB_CACHE": str(cache),
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    script = f'attnlab() {{ "{sys.executable}" -m attnlab "$@"; }}\n{command}\n'
    done = subprocess.run(["bash", "-c", script], cwd=cwd, env=env, text=True,
                          capture_output=True, timeout=300)
    assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_the_main_command_trains_the_copy_model(copy_run: tuple[Path, str]) -> None:
    assert page_commands(README.read_text(encoding="utf-8"))[2] == MAIN  # after the set-up
    cwd, output = copy_run
    assert "after    answer accuracy 100.0%" in output
    run = cwd / "runs" / "copy"  # what its `saved` line names
    assert (run / "ckpt").is_dir() and (run / "metrics.jsonl").is_file()
    assert (run / "loss.png").is_file()


@pytest.mark.parametrize("page", PAGES, ids=page_name)
def test_page_runs_as_written(page: Path, copy_run: tuple[Path, str], tmp_path: Path,
                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The page's CHEAP commands and its Python blocks, in page order, in a fresh directory
    holding the copy run."""
    name = page_name(page)
    expected = dict(CHEAP.get(name, []))
    slow = SLOW.get(name, {})
    steps = [(lang, body) for lang, body in blocks(page.read_text(encoding="utf-8"))
             if lang == "python" or any(c in expected for c in commands_of(body))]
    if not steps:
        pytest.skip(f"{name} has no cheap command and no Python block")
    (tmp_path / "shared").symlink_to(ROOT.parent / "shared", target_is_directory=True)
    cwd = tmp_path / "work"
    shutil.copytree(copy_run[0] / "runs", cwd / "runs")
    cache = tmp_path / "cache"
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("ATTNLAB_CACHE", str(cache))
    namespace: dict[str, Any] = {}
    ran = []
    for i, (lang, body) in enumerate(steps):
        if lang == "bash":
            for command in commands_of(body):
                if command in expected:
                    assert expected[command] in run_command(command, cwd, cache), command
                    ran.append(command)
        elif not any(line in body for line in slow):
            exec(compile(body, f"{name}, Python block {i}", "exec"), namespace)  # the page's code
            ran.append(f"python block {i}")
    assert [c for c in ran if c in expected] == list(expected)  # each once, in page order


@pytest.mark.parametrize("page", PAGES, ids=page_name)
def test_every_listed_command_and_slow_block_is_on_its_page(page: Path) -> None:
    name, text = page_name(page), page.read_text(encoding="utf-8")
    commands = page_commands(text)
    cheap = [c for c, _ in CHEAP.get(name, [])]
    missing = [c for c in cheap if c not in commands]
    assert missing == [], f"{name} no longer has {missing}; update CHEAP"
    in_page_order = list(dict.fromkeys(c for c in commands if c in cheap))
    assert in_page_order == cheap
    python = [body for lang, body in blocks(text) if lang == "python"]
    for line in SLOW.get(name, {}):
        assert sum(line in body for body in python) == 1, f"{name}: SLOW line {line!r}"


def test_cheap_and_slow_name_existing_pages() -> None:
    names = {page_name(p) for p in PAGES}
    assert set(CHEAP) <= names and set(SLOW) <= names


def test_the_extractor_reads_continuations_and_comments() -> None:
    text = "```bash\nattnlab train   # the copy task\n# a note\ntorchrun a \\\n  -m b\n```\n"
    assert page_commands(text) == ["attnlab train", "torchrun a -m b"]
    assert blocks("```python\nx = 1\n```\n```text\nno\n```\n") == [("python", "x = 1\n")]


@pytest.mark.parametrize("command", [c for page in CHEAP.values() for c, _ in page])
def test_cheap_commands_are_attnlab_commands(command: str) -> None:
    assert command.startswith("attnlab ")  # nothing here installs, downloads or serves


def test_the_readme_is_a_front_page_and_ci_runs_its_set_up() -> None:
    """At most ~300 lines; the set-up is the first block, and CI installs and tests exactly
    as it says."""
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 300
    assert page_commands(text)[:2] == [INSTALL, TESTS]
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert INSTALL in ci and TESTS in ci


def _layout(text: str) -> str:
    layout = text[text.index("## Layout"):]
    return layout[:layout.find("\n## ", 1) if "\n## " in layout[1:] else len(layout)]


def test_layout_names_every_module() -> None:
    """The README's Layout table names every module of the package (a new module, or one
    split into a folder, shows up here until the table says what it owns)."""
    layout = _layout(README.read_text(encoding="utf-8"))
    package = ROOT / "src" / "attnlab"
    names = [p.name for p in package.glob("*.py") if not p.name.startswith("__")]
    names += [f"{p.name}/" for p in package.iterdir() if p.is_dir() and p.name != "__pycache__"]
    names += [p.name for p in (package / "hf").glob("*.py") if not p.name.startswith("__")]
    missing = sorted(n for n in names if f"`{n}`" not in layout)
    assert not missing, f"README's Layout table does not name {missing}"


def test_layout_rows_follow_the_layer_order() -> None:
    from test_layout import LAYERS  # the one place the order is written

    layout = _layout(README.read_text(encoding="utf-8"))
    rows = re.findall(r"^\| `([a-z_]+)(?:/|\.py)` \|", layout, flags=re.M)
    assert rows == [layer for layer in LAYERS if not layer.startswith("__")]


def test_the_benchmark_tables_are_what_the_results_give() -> None:
    """docs/benchmarks.md's tables and the README's summary are `python -m
    benchmarks.report`'s output for the checked-in results, the summary a dozen rows at most
    (and the GPU table six), each naming its CPU or GPU."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from benchmarks import report
    from benchmarks.gpu_report import MAX_GPU_ROWS

    results = report.load_results()
    assert results, "benchmarks/results/ holds no recorded run"
    for path, text in report.pages(results).items():
        assert path.read_text(encoding="utf-8") == text, (
            f"{page_name(path)} is stale: run python -m benchmarks.report")
    cpu, _, gpu = report.summary(results).partition("| measured on a GPU")
    tables = {"CPU": (cpu, report.MAX_SUMMARY_ROWS), "GPU": (gpu, MAX_GPU_ROWS)}
    for name, (table, limit) in tables.items():
        rows = [line for line in table.splitlines()
                if line.startswith("| ") and not line.startswith("| measured")]
        assert len(rows) <= limit, (name, len(rows))
        assert all(row.rstrip(" |").rsplit("| ", 1)[1].strip() for row in rows), name
        assert rows or name == "GPU"


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
