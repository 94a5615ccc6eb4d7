"""The commands, paths and lists the README and docs/*.md name are the code's: every
`attnlab COMMAND ... --flag` is a flag of that command's parser, every `python -m benchmarks
SUITE` a suite and every `python -m benchmarks.MODULE ... --flag` a flag that module adds,
every `src/`, `tests/`, `benchmarks/` or `docs/` path exists, and the lists a page keeps of
a code constant (what `--resume` may change, the viewer's limits, `--what`'s kinds, the
benchmark suites) are that constant.

tests/test_readme.py runs the cheap commands and the Python blocks, and tests/test_docs_links.py
the links; this file runs nothing: it parses the pages and the parsers (a few seconds, most of
it train's parser importing torch), so it also covers the commands no test can afford to run
(tiny Shakespeare, torchrun, hub models, GPU suites).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from attnlab.cli import COMMANDS, build_parser

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BENCHMARKS = ROOT / "benchmarks"
SEPARATORS = {"|", "||", "&&", ";", "&", "#", ">", "<"}


def name(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


def commands(text: str) -> list[str]:
    """Every command a page shows: each line of its code blocks (continuations joined, a
    trailing comment dropped) and each inline code span, joined onto one line."""
    found = []
    for block in re.findall(r"^```[a-z]*\n(.*?)^```", text, flags=re.S | re.M):
        for line in block.replace("\\\n", " ").splitlines():
            found.append(re.sub(r"\s#\s.*$", "", line).strip())
    prose = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    found += [" ".join(span.split()) for span in re.findall(r"`([^`]+)`", prose)]
    return [c for c in found if c]


def words(command: str) -> list[str]:
    """The command's words as a shell splits them (a quoted argument is one word)."""
    try:
        return shlex.split(command, comments=False)
    except ValueError:  # an inline span cut inside a quote: its words as written
        return command.split()


def flags_after(tokens: list[str], start: int) -> list[str]:
    """The flags from tokens[start] to the end of that command (a pipe, `&&`, `;`)."""
    out = []
    for token in tokens[start:]:
        if token in SEPARATORS or token.startswith("#"):
            break
        if re.fullmatch(r"--[A-Za-z][\w-]*(=.*)?", token):
            out.append(token.split("=", 1)[0])
    return out


def attnlab_flags(command: str) -> list[tuple[str, str]]:
    """(command, flag) of every `attnlab COMMAND ... --flag` (torchrun's `-m attnlab train`
    too) in a command line."""
    tokens = words(command)
    return [(tokens[i + 1], flag) for i, token in enumerate(tokens[:-1])
            if token == "attnlab" and tokens[i + 1] in COMMANDS
            for flag in flags_after(tokens, i + 2)]


def spelt(flag: str) -> str:
    return flag.replace("_", "-")  # every command takes either spelling (cli.spell_flags)


@pytest.fixture(scope="module")
def parser_flags() -> dict[str, set[str]]:
    _, parsers = build_parser()
    return {command: {spelt(f) for action in parser._actions for f in action.option_strings}
            for command, parser in parsers.items()}


def test_the_extractor_reads_blocks_spans_and_quotes() -> None:
    text = ("```bash\nattnlab generate CKPT \"a --b\" --top-k 4 \\\n  --seed=1 | head --lines 2"
            "   # --not-a-flag\n```\nThen `attnlab inspect X --what\nrow` and `--quiet`.\n")
    found = [pair for c in commands(text) for pair in attnlab_flags(c)]
    assert found == [("generate", "--top-k"), ("generate", "--seed"), ("inspect", "--what")]
    assert attnlab_flags("torchrun --nproc_per_node 2 -m attnlab train --data x") == [
        ("train", "--data")]
    assert attnlab_flags('--runs "attnlab train, GPU recipe, --cuda_graph true"') == []


def test_every_attnlab_flag_on_the_pages_is_a_flag_of_its_command(
        parser_flags: dict[str, set[str]]) -> None:
    wrong = [f"{name(page)}: attnlab {command} {flag} (in `{line[:80]}`)"
             for page in PAGES for line in commands(page.read_text(encoding="utf-8"))
             for command, flag in attnlab_flags(line)
             if spelt(flag) not in parser_flags[command]]
    assert not wrong, "flags the commands do not have:\n" + "\n".join(wrong)


def test_a_flag_the_command_lacks_is_caught(parser_flags: dict[str, set[str]]) -> None:
    line = "attnlab generate runs/copy/ckpt abc --max_new_tokens 8 --topk 4"
    assert [f for c, f in attnlab_flags(line) if spelt(f) not in parser_flags[c]] == ["--topk"]


def _module_flags(module: str) -> set[str]:
    """The flags `python -m benchmarks.MODULE` takes: those its source adds, and the shared
    ones of `gpu_common.suite_main` where it runs through that."""
    source = (BENCHMARKS / f"{module}.py").read_text(encoding="utf-8")
    if "suite_main" in source:
        source += (BENCHMARKS / "gpu_common.py").read_text(encoding="utf-8")
    return set(re.findall(r"add_argument\(\s*\"(--[\w-]+)\"", source))


def test_every_benchmark_command_on_the_pages_exists() -> None:
    import sys

    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from benchmarks.__main__ import SUITES

    wrong = []
    for page in PAGES:
        for line in commands(page.read_text(encoding="utf-8")):
            tokens = words(line)
            for i, token in enumerate(tokens[:-1]):
                target = tokens[i + 1]
                if token != "-m" or not re.fullmatch(r"benchmarks(\.\w+)?", target):
                    continue
                module = target.partition(".")[2] or "__main__"
                if not (BENCHMARKS / f"{module}.py").is_file():
                    wrong.append(f"{name(page)}: no benchmarks/{module}.py")
                    continue
                rest = tokens[i + 2:]
                suites = rest[:next((j for j, t in enumerate(rest) if not t.isidentifier()),
                                    len(rest))] if module == "__main__" else []
                wrong += [f"{name(page)}: no benchmark suite {s!r}" for s in suites
                          if s not in {*SUITES, "all", "readme", "SUITE"}]
                wrong += [f"{name(page)}: python -m {target} has no {flag}"
                          for flag in flags_after(tokens, i + 2)
                          if flag not in _module_flags(module)]
    assert not wrong, "\n".join(wrong)


def test_every_repository_path_on_the_pages_exists() -> None:
    """`src/...`, `tests/...`, `benchmarks/...` and `docs/...` as the pages write them (a
    name's start, `docs/notebooks/002`, counts when a file there begins with it)."""
    missing = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for path in re.findall(r"(?<![\w/.$-])((?:src|tests|benchmarks|docs)/[\w./-]*\w)", text):
            where = ROOT / path
            if not where.exists() and not any(
                    p.name.startswith(where.name) for p in where.parent.glob("*")):
                missing.append(f"{name(page)}: {path}")
    assert not missing, "paths that do not exist:\n" + "\n".join(sorted(set(missing)))


def _between(text: str, start: str, end: str) -> str:
    assert start in text, f"the page no longer says {start!r}: update this test"
    return text.split(start, 1)[1].split(end, 1)[0]


def test_the_flags_a_resumed_run_may_change_are_the_codes() -> None:
    from attnlab.cli.train_resume import RESUME_SAFE

    said = _between((ROOT / "docs" / "train.md").read_text(encoding="utf-8"),
                    "how long and how often\n(", ")")
    assert re.findall(r"`--(\w+)`", said) == list(RESUME_SAFE)


def test_the_viewers_limits_table_is_serve_configs_fields() -> None:
    import dataclasses

    from attnlab.viewer.state import ServeConfig

    text = (ROOT / "docs" / "viewer.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| `--(\w+)` \| (\d+) \|", text, flags=re.M)
    assert rows == [(f.name, str(f.default)) for f in dataclasses.fields(ServeConfig)]


def test_inspects_what_table_is_its_kinds() -> None:
    from attnlab.cli.inspect import DEFAULT_WHAT, WHAT

    text = (ROOT / "docs" / "inspect.md").read_text(encoding="utf-8")
    table = _between(text, "| `--what` | draws |", "\n\n")
    assert re.findall(r"^\| `(\w+)` \|", table, flags=re.M) == [*WHAT, "all"]
    assert f"(default `{DEFAULT_WHAT}`)" in text


def test_the_benchmark_suites_listed_are_the_suites() -> None:
    import sys

    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from benchmarks.__main__ import SUITES

    said = _between((ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8"),
                    "they are ", ", or `all`")
    assert re.findall(r"`(\w+)`", said) == list(SUITES)
