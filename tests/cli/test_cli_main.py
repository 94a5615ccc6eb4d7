"""The `attnlab` entry point itself (cli/__init__.py): what it imports before a command runs,
how it ends on Ctrl-C, and how it reads the words and flags of any command."""

from __future__ import annotations

import importlib
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import attnlab.cli
from attnlab.cli import COMMANDS, build_parser, main
from attnlab.cli.common import spell_flags
from helpers import nano_checkpoint

SRC = Path(attnlab.cli.__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return nano_checkpoint(tmp_path_factory.mktemp("ckpt"), "abcdefghijklmnopqrstuvwxyz|")


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"}, timeout=60)


@pytest.mark.parametrize("argv", [["--version"], ["--help"], [], ["generate", "--help"]])
def test_version_and_help_import_no_torch(argv: list[str]) -> None:
    """`attnlab --version` took 3 s: the package and the CLI imported torch at their top."""
    done = _python(f"import sys\nfrom attnlab.cli import main\ntry:\n    main({argv!r})\n"
                   "except SystemExit:\n    pass\nprint(sorted(m for m in sys.modules "
                   "if m.split('.')[0] == 'torch')[:3])")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "[]"


def test_the_command_list_is_each_commands_own_line() -> None:
    parser, parsers = build_parser()
    listed = {a.dest: a.help for a in parser._subparsers._group_actions[0]._choices_actions}
    assert listed == COMMANDS and set(parsers) == set(COMMANDS)


def test_public_names_load_on_first_use() -> None:
    import attnlab

    for name in attnlab.__all__:
        assert getattr(attnlab, name) is not None, name
    assert attnlab.viz.__name__ == "attnlab.viz"  # a subpackage, as when imports were eager
    with pytest.raises(AttributeError, match="has no attribute 'nothing'"):
        attnlab.nothing  # noqa: B018


def test_ctrl_c_while_the_command_loads_is_one_line(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Ctrl-C in the first seconds (torch importing, parsers building) printed a traceback."""
    def interrupted(*args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(attnlab.cli, "build_parser", interrupted)
    assert main(["generate", "CKPT", "abc"]) == 130
    assert capsys.readouterr().err == "attnlab generate: interrupted\n"


def test_ctrl_c_at_any_moment_is_one_line(checkpoint: Path) -> None:
    """A real SIGINT, early: stderr is the one line, the status that of an interrupt."""
    command = [sys.executable, "-m", "attnlab", "generate", str(checkpoint), "abc|",
               "--sliding-window", "--max-new-tokens", "1000000", "--device", "cpu"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               text=True, env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"})
    try:
        time.sleep(0.5)
        process.send_signal(signal.SIGINT)
        # an interrupt swallowed during torch's import went on generating a million tokens
        _, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:  # a failure, not a hung suite
            process.kill()
            process.communicate()
    # 130, or killed by SIGINT where torch's import ran Python code that the interrupt left
    # (CPython then exits by the signal; a shell shows 130 for both)
    assert process.returncode in (130, -signal.SIGINT)
    assert err == "attnlab generate: interrupted\n"


def test_ctrl_c_while_a_parser_imports_torch_waits_for_the_import(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """train's parser imports torch (GPTConfig's fields are its flags): a Ctrl-C there
    (under load, 0.4-0.6 s after Enter) left a half-imported numpy ("cannot load module more
    than once"), aborted in pybind11, or was swallowed and the run trained to its end."""
    real_import = importlib.import_module
    imported: list[str] = []

    def import_interrupted(name: str, package: str | None = None) -> object:
        if name != "attnlab.cli.train":
            return real_import(name, package)
        signal.raise_signal(signal.SIGINT)  # lands in the import, as a real Ctrl-C may
        module = real_import(name)
        imported.append(name)
        return module

    monkeypatch.setattr(attnlab.cli.importlib, "import_module", import_interrupted)
    assert main(["train", "--max_iters", "1"]) == 130
    assert imported == ["attnlab.cli.train"]  # the import ran to its end, then the interrupt
    assert capsys.readouterr().err == "attnlab train: interrupted\n"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


@pytest.mark.parametrize("command", [["info", "somewhere"], []])
def test_ctrl_c_while_the_console_script_loads_the_cli_is_one_line(command: list[str]) -> None:
    """The `attnlab` script imported `attnlab.cli` before calling its main, so a Ctrl-C in
    those first ~0.1 s (25-42 of 60 Ctrl-Cs sent 0.06-0.14 s after the start, under load)
    printed a KeyboardInterrupt traceback. Here the Ctrl-C lands in the import of
    cli/common.py, through the script's target as pyproject names it."""
    import tomllib

    target = tomllib.loads((SRC.parent / "pyproject.toml").read_text())["project"]["scripts"]
    module, function = target["attnlab"].split(":")
    done = _python(
        "import importlib, os, signal, sys\n"
        "class Interrupt:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'attnlab.cli.common':\n"
        "            os.kill(os.getpid(), signal.SIGINT)\n"
        "        return None\n"
        "sys.meta_path.insert(0, Interrupt())\n"
        f"sys.argv = ['attnlab', *{command!r}]\n"
        f"main = getattr(importlib.import_module({module!r}), {function!r})\n"
        "sys.exit(main())")
    assert done.stderr == f"attnlab{' info' if command else ''}: interrupted\n"
    assert done.returncode == 130 and done.stdout == ""


def test_ctrl_c_after_the_command_is_over_keeps_its_status() -> None:
    """Once the command is done the interpreter takes a second to tear torch down; a Ctrl-C
    there made a finished `attnlab train` exit by SIGINT (a failure to a shell) or print
    "Exception ignored ... KeyboardInterrupt"."""
    done = _python("import os, signal, sys, time\nfrom attnlab.cli import main\n"
                   "sys.argv = ['attnlab']\nstatus = main()\n"
                   "os.kill(os.getpid(), signal.SIGINT)\ntime.sleep(0.2)\nsys.exit(status)")
    assert done.returncode == 2, done.stderr  # `attnlab` alone: the help, status 2
    assert done.stderr == ""
    assert done.stdout.startswith("usage: attnlab")


def test_spell_flags_maps_either_spelling_of_every_flag_onto_the_one_added() -> None:
    _, parsers = build_parser()
    for parser in parsers.values():
        for flag in (f for a in parser._actions for f in a.option_strings if f[2:].count("-")
                     or "_" in f):
            for spelling in (flag.replace("_", "-"), "--" + flag[2:].replace("-", "_")):
                assert spell_flags(parser, [spelling, f"{spelling}=1"]) == [flag, f"{flag}=1"]
    assert spell_flags(parsers["generate"], ["--", "--top_k"]) == ["--", "--top_k"]


@pytest.mark.parametrize(("argv", "dest", "value"), [
    # serve and train took only `_`, demo and heads only `-`
    (["serve", "CKPT", "--max-new-tokens", "5"], "ServeConfig.max_new_tokens", 5),
    (["train", "--max-iters", "7"], "TrainConfig.max_iters", 7),
    (["train", "--decay-lr=no"], "TrainConfig.decay_lr", False),
    (["generate", "CKPT", "--max_new_tokens", "5"], "max_new_tokens", 5),
    (["demo", "hello", "--no_figures"], "figures", False),
    (["heads", "CKPT", "--no_ablation"], "ablation", False),
    # a bool config field alone is true, as generate's switch --compile is
    (["train", "--compile"], "TrainConfig.compile", True),
    (["train", "--compile", "--lr", "1"], "TrainConfig.compile", True),
    (["train", "--compile", "false"], "TrainConfig.compile", False),
])
def test_every_command_takes_either_spelling_of_a_flag(
        monkeypatch: pytest.MonkeyPatch, argv: list[str], dest: str, value: object) -> None:
    seen: dict[str, object] = {}
    module = importlib.import_module(f"attnlab.cli.{argv[0]}")
    monkeypatch.setattr(module, "run", lambda args: seen.update(vars(args)) or 0)
    assert main(argv) == 0
    assert seen[dest] == value


@pytest.mark.parametrize(("argv", "said"), [
    # the second word of an unquoted prompt: it said "unknown arguments ['extra']" and listed
    # every flag
    (["generate", "CKPT", "abc|", "extra"], "unexpected word 'extra' after PROMPT 'abc|'; a "
     "PROMPT of several words goes in quotes: 'abc| extra'"),
    (["inspect", "CKPT", "the", "cat", "sat"], "unexpected words 'cat sat' after TEXT 'the'"),
    (["info", "CKPT", "extra"], "unexpected word 'extra' (attnlab info takes CHECKPOINT)"),
    # a switch takes no value: "true" became the prompt, and "false" meant true
    (["generate", "CKPT", "--compile", "true"], "--compile takes no value: give --compile "
     "alone, or leave it out ('true' after it would be read as an argument of its own)"),
    (["heads", "CKPT", "--no-ablation", "False"], "--no-ablation takes no value"),
    # a flag for the positional text, which is then missing
    (["lens", "CKPT", "--prompt=abc"], "the following arguments are required: text; "
     "--prompt=abc (the text is positional, without a flag: attnlab lens CHECKPOINT text)"),
])
def test_words_a_command_cannot_place_say_what_to_write(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        argv: list[str], said: str) -> None:
    module = importlib.import_module(f"attnlab.cli.{argv[0]}")
    monkeypatch.setattr(module, "run", lambda args: pytest.fail("ran"))
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and said in err and err.count("\n") == 1, err


@pytest.mark.parametrize(("argv", "said"), [
    # argparse took --prompt for an abbreviated --prompt-file, then said the file "Hi" did not
    # exist
    (["generate", "CKPT", "--prompt", "Hi"], "unknown  --prompt (the prompt is positional, "
     "without a flag: attnlab generate CHECKPOINT prompt)"),
    (["heads", "CKPT", "--text=cat"], "unknown  --text=cat (the text is positional, without "
     "a flag: attnlab heads CHECKPOINT text)"),
    # an abbreviation is named, not taken
    (["generate", "CKPT", "x", "--max-new", "3"], "unknown  --max-new (did you mean "
     "--max-new-tokens?)"),
    (["train", "--max_it", "3"], "unknown  --max_it (did you mean --max_iters?)"),
])
def test_a_flag_for_a_positional_or_an_abbreviated_flag_is_named(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        argv: list[str], said: str) -> None:
    module = importlib.import_module(f"attnlab.cli.{argv[0]}")
    monkeypatch.setattr(module, "run", lambda args: pytest.fail("ran"))
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert said in err and "known flags: " in err, err


def test_a_prompt_true_before_a_switch_is_a_prompt(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, object] = {}
    monkeypatch.setattr(importlib.import_module("attnlab.cli.generate"), "run",
                        lambda args: seen.update(vars(args)) or 0)
    assert main(["generate", "CKPT", "true", "--compile"]) == 0
    assert seen["prompt"] == "true" and seen["compile"] is True


@pytest.mark.parametrize(("command", "default"), [("patch", "./patch"), ("lens", "./lens"),
                                                  ("inspect", "inspect"), ("heads", "./heads")])
def test_help_says_where_out_goes_by_default(command: str, default: str) -> None:
    _, parsers = build_parser([command])
    out = next(a for a in parsers[command]._actions if a.dest == "out")
    assert f"(default: {default})" in str(out.help) or f"(default {default})" in str(out.help)


def test_bench_help_says_a_quick_run_writes_no_readme_table() -> None:
    _, parsers = build_parser(["bench"])
    assert "so a --quick run writes none" in " ".join(str(parsers["bench"].description).split())
