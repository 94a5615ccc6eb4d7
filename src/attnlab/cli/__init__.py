"""The `attnlab` command: `attnlab train | generate | inspect | serve | bench | demo | info |
cache | export | heads | patch | lens`.

Only the CLI prints. Each subcommand lives in its own module in this package, exposing
`add_parser(subparsers)` and `run(args) -> int`, and imports heavy dependencies inside
`run`; only the command named on the command line has its parser built, so `attnlab --help`,
`--version` and a Ctrl-C while torch loads need no torch. Config dataclasses map onto flags
one to one (`--n_layer 4 --lr 1e-3`) through `add_config_flags` / `config_from_flags`.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import itertools
import os
import re
import shlex
import signal
import sys
import threading
import warnings
from collections.abc import Collection, Sequence
from typing import Any, NoReturn

from .common import (
    CLIError,
    check_device,
    cpu_memory_errors,
    expand_paths,
    interrupts_held,
    out_of_memory,
    spell_flags,
)

#: each command's line in `attnlab --help`, here so that the list loads none of the commands
#: (train's flags come from GPTConfig, whose module imports torch); each module's parser says
#: the same (tested)
COMMANDS = {
    "train": "train a model (default: the copy task, under a minute on a CPU)",
    "generate": "extend a prompt with a trained model (streams text as it comes)",
    "inspect": "draw a text's attention (heatmaps, layer x head grid) and save it as JSON",
    "serve": "web page to explore attention and stream generations",
    "bench": "run the speed and quality benchmarks (needs a source checkout)",
    "demo": "run a seed experiment (hello, animals, averaging) and draw it",
    "info": "print a model directory's config, size, tokenizer and training state",
    "cache": "list the token cache (texts tokenized for training) or clear it",
    "export": "write a checkpoint as a Hugging Face model directory",
    "heads": "find previous-token, duplicate-token, induction and first-token heads",
    "patch": "activation or attribution patching of heads and residual positions",
    "lens": "logit lens: which layer already predicts the next token",
}


def _check_device(args: argparse.Namespace) -> None:
    """Every command's --device, checked once before it runs: a device this machine lacks
    (no CUDA, no MPS, cuda:7 on a one-GPU machine) is named as such in one line (loading
    weights onto it failed as "corrupted", pin_memory's error)."""
    device = getattr(args, "device", None) or getattr(args, "TrainConfig.device", None)
    if isinstance(device, str) and device != "cpu":
        check_device(device)


class _Parser(argparse.ArgumentParser):
    """argparse with one-line usage errors: the full usage of `attnlab train` is dozens of
    lines that bury the one that says what was wrong (`--help` still shows it); and no
    abbreviated flags, which took `generate DIR --prompt "Hi"` for --prompt-file and then
    said the file "Hi" did not exist (an unknown flag is named, with the close ones)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **{"allow_abbrev": False, **kwargs})
        self.words: list[str] = []  # what this parser was given, for `error` to read

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        self.words = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> NoReturn:
        # `attnlab trian`, `--dtype bf16`: name the closest choice (Python 3.14 does this too)
        bad = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if bad:
            choices = re.findall(r"'([^']*)'", bad[2])
            close = difflib.get_close_matches(bad[1], choices, n=1, cutoff=0.5)
            message += f"; did you mean {close[0]!r}?" if close else ""
        # `--time_budget -5m`: argparse reads a value that starts with '-' as the next flag
        missing = re.match(r"argument (--[\w-]+)[^:]*: expected one argument", message)
        if missing:
            message += f" (a value that starts with '-' is written {missing[1]}=VALUE)"
        # `inspect DIR --text "the cat"`: the text is positional (and so still missing)
        flagged = [w for w in self.words if w.split("=", 1)[0] in ("--text", "--prompt")]
        hint = flagged and _positional_hint(self, self.prog.split()[-1], flagged[0])
        if hint and "arguments are required" in message:
            message += f"; {hint}"
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _flag_hint(flag: str, known: list[str]) -> str | None:
    """`--flag (did you mean ...?)`: the flags it abbreviates, else the close ones."""
    name = flag.split("=", 1)[0]
    close = [k for k in known if k.startswith(name)][:3] or _close_flags(flag, known)
    return f"{flag} (did you mean {' or '.join(close)}?)" if close else None


def _positional_hint(parser: argparse.ArgumentParser, command: str, flag: str) -> str | None:
    """What to say of `--prompt` or `--text` given to a command whose text is positional
    (`attnlab generate DIR "text"`), as other tools take it by flag."""
    name = flag.lstrip("-").split("=", 1)[0].replace("-", "_")
    positionals = [a for a in parser._actions if not a.option_strings]
    texts = [a for a in positionals if a.dest in ("text", "prompt")]
    if not texts or name not in ("text", "prompt", texts[0].dest):
        return None
    usage = " ".join(a.metavar if isinstance(a.metavar, str) else a.dest for a in positionals)
    return (f"{flag} (the {texts[0].dest} is positional, without a flag: attnlab {command} "
            f"{usage})")


def _close_flags(flag: str, known: list[str]) -> list[str]:
    """Known flags close to a misspelt one (`--n_layers` -> `--n_layer`)."""
    return difflib.get_close_matches(flag.split("=", 1)[0], known, n=2, cutoff=0.75)


def _late_positionals(sub: argparse.ArgumentParser, args: argparse.Namespace,
                      unknown: list[str]) -> list[str]:
    """argparse fills positionals in one run, so in `attnlab generate CKPT --temperature 0
    "abc"` the optional prompt is already empty when "abc" comes: fill such optional
    positionals, in order, from the leftovers; return what is still unknown."""
    empty = [a for a in sub._actions if not a.option_strings and a.nargs == "?"
             and getattr(args, a.dest, None) == a.default]
    rest = []
    for item in unknown:
        if empty and not item.startswith("-"):
            setattr(args, empty.pop(0).dest, item)
        else:
            rest.append(item)
    return rest


def _switch_values(sub: argparse.ArgumentParser, argv: list[str]) -> None:
    """Refuse true/false after a switch (`generate CKPT --compile false`): a switch takes no
    value, so the word would become the prompt, or an unknown argument, and false mean true."""
    switches = {flag for action in sub._actions if action.nargs == 0
                for flag in action.option_strings}
    for flag, word in itertools.pairwise(argv):
        if flag == "--":
            return
        if flag in switches and word.lower() in ("true", "false"):
            sub.error(f"{flag} takes no value: give {flag} alone, or leave it out ({word!r} "
                      "after it would be read as an argument of its own)")


def _stray_words(sub: argparse.ArgumentParser, args: argparse.Namespace,
                 words: list[str]) -> str:
    """What to say of words past the last positional: for a text (`generate CKPT abc extra`),
    to quote it."""
    positionals = [action for action in sub._actions if not action.option_strings]
    stray = f"{'word' if len(words) == 1 else 'words'} {' '.join(words)!r}"
    if not positionals or positionals[-1].dest not in ("prompt", "text"):
        takes = " ".join(str(a.metavar or a.dest) + (" ..." if a.nargs in ("*", "+") else "")
                         for a in positionals)
        return f"unexpected {stray} ({sub.prog} takes {takes or 'flags only'})"
    text = positionals[-1]
    name, value = str(text.metavar or text.dest.upper()), getattr(args, text.dest)
    return (f"unexpected {stray} after {name} {value!r}; a {name} of several words goes in "
            f"quotes: {shlex.quote(' '.join([value, *words]))}")


def known_flags(parser: argparse.ArgumentParser) -> list[str]:
    return sorted(s for a in parser._actions for s in a.option_strings if s.startswith("--"))


def _version() -> str:
    import platform
    from importlib.metadata import PackageNotFoundError, version

    from .. import __version__

    try:  # the installed version, read without importing torch (seconds)
        torch_version = version("torch")
    except PackageNotFoundError:
        torch_version = "not installed"
    return f"attnlab {__version__} (torch {torch_version}, Python {platform.python_version()})"


def build_parser(commands: Collection[str] = tuple(COMMANDS)
                 ) -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The `attnlab` parser and the parsers of `commands`, built in full; the other commands
    are listed by their line alone (building train's imports torch)."""
    parser = _Parser(  # subcommand parsers take the same class
        prog="attnlab",
        description="Build, train, generate with and look inside causal attention models.",
    )
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    parsers: dict[str, argparse.ArgumentParser] = {}
    for name, line in COMMANDS.items():
        if name not in commands:
            sub.add_parser(name, help=line)
            continue
        # train's, serve's and info's parsers import torch (GPTConfig's fields are flags)
        with interrupts_held():
            try:
                module = importlib.import_module(f"attnlab.cli.{name}")
            except ModuleNotFoundError as err:
                if err.name != f"attnlab.cli.{name}":
                    raise
                continue
            parsers[name] = module.add_parser(sub)
        parsers[name].set_defaults(_run=module.run)
    return parser, parsers


def main(argv: Sequence[str] | None = None) -> int:
    """Run `attnlab ARGV...`: the exit status. argv None: the program itself (the console
    script, `python -m attnlab`), which exits when this returns."""
    program = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    command = command_of(argv)
    try:
        status = _main(argv, command)
    except KeyboardInterrupt:  # also while torch or a model loads: one line, no traceback
        print(interrupted_line(command), file=sys.stderr)
        status = 130
    if program and threading.current_thread() is threading.main_thread():
        # the command is over, its output written: the second or so the interpreter takes to
        # tear torch down is not to be interrupted (a Ctrl-C there killed a finished run,
        # status -SIGINT, or printed "Exception ignored ... KeyboardInterrupt"; SIG_IGN,
        # unlike a handler, is kept through the interpreter's finalization)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    return status


def command_of(argv: Sequence[str]) -> str | None:
    """The command of `attnlab ARGV...`: the first word, as `attnlab` itself takes no flag
    with a value."""
    return next((word for word in argv if not word.startswith("-")), None)


def interrupted_line(command: str | None) -> str:
    """What a Ctrl-C prints: `attnlab train: interrupted` (`attnlab: interrupted` without
    a command)."""
    return f"attnlab{' ' + command if command in COMMANDS else ''}: interrupted"


def _main(argv: list[str], command: str | None) -> int:
    parser, parsers = build_parser([command] if command in COMMANDS else [])
    if command in parsers:
        argv = spell_flags(parsers[command], argv)
        _switch_values(parsers[command], argv)
    args, unknown = parser.parse_known_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    sub = parsers[args.command]
    for action in sub._actions:
        # argparse in Python 3.11 turns `--lr=--` into [] instead of an error
        stores_one = isinstance(action, argparse._StoreAction) and action.nargs is None
        if stores_one and getattr(args, action.dest, None) == []:
            sub.error(f"argument {action.option_strings[0]}: expected one argument")
    unknown = _late_positionals(sub, args, unknown)
    if unknown and not any(word.startswith("-") for word in unknown):
        sub.error(_stray_words(sub, args, unknown))
    if unknown:
        known = known_flags(sub)
        hints = [hint for flag in unknown if flag.startswith("-")
                 for hint in [_positional_hint(sub, args.command, flag)
                              or _flag_hint(flag, known)] if hint]
        print(
            f"attnlab {args.command}: unknown arguments {unknown}\n"
            + "".join(f"unknown  {hint}\n" for hint in hints)
            + f"known flags: {' '.join(known)}",
            file=sys.stderr,
        )
        return 2
    expand_paths(args)
    return _run(args)


def _import_torch() -> Any:
    """torch, and the rest of what every command imports, with a Ctrl-C held over the import
    (interrupts_held)."""
    with interrupts_held():
        import torch

        import attnlab.model.runtime  # noqa: F401
    return torch


def _run(args: argparse.Namespace) -> int:
    """Run the parsed command: its errors as one line each, the exit status."""
    torch = _import_torch()
    from ..model.runtime import reuse_freed_memory

    reuse_freed_memory()
    formatwarning = warnings.formatwarning  # library warnings as one line, like errors
    warnings.formatwarning = lambda message, *_, **__: (
        f"attnlab {args.command}: warning: {message}\n")
    try:
        _check_device(args)
        with cpu_memory_errors():
            return int(args._run(args) or 0)
    except BrokenPipeError:  # `attnlab heads ... | head`: the reader has what it wanted
        # stdout's buffer cannot be flushed any more: point it at nothing, exit quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # what a shell reports for SIGPIPE
    except (CLIError, ValueError, OSError, ImportError, FloatingPointError) as err:
        # library errors carry the bad value and the fix; a traceback adds nothing for users
        if os.environ.get("ATTNLAB_DEBUG"):
            raise
        print(f"attnlab {args.command}: error: {err}", file=sys.stderr)
        return 1
    except torch.OutOfMemoryError as err:  # a command that knows what to reduce says so first
        if os.environ.get("ATTNLAB_DEBUG"):
            raise
        print(f"attnlab {args.command}: error: {out_of_memory(args.command, err)}",
              file=sys.stderr)
        return 1
    finally:
        warnings.formatwarning = formatwarning


if __name__ == "__main__":
    sys.exit(main())
