"""The `attnlab` command: `attnlab train | generate | inspect | serve | bench | demo | info |
export | heads | patch | lens`.

Only the CLI prints. Each subcommand lives in its own module in this package, exposing
`add_parser(subparsers)` and `run(args) -> int`, and imports heavy dependencies inside
`run` so `attnlab --help` stays fast. Config dataclasses map onto flags one to one
(`--n_layer 4 --lr 1e-3`) through `add_config_flags` / `config_from_flags`.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import functools
import importlib
import json
import os
import re
import sys
import types
import warnings
from collections.abc import Sequence
from inspect import getsource  # (`import inspect` would be shadowed by cli/inspect.py)
from typing import Any, NoReturn, TypeVar, Union, get_args, get_origin, get_type_hints

from ..runtime import reuse_freed_memory

COMMANDS = ("train", "generate", "inspect", "serve", "bench", "demo", "info", "export", "heads",
            "patch", "lens")

T = TypeVar("T")


class CLIError(Exception):
    """A user error the CLI reports in one line, without a traceback."""


def _parse_bool(text: str) -> bool:
    lowered = text.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true/false, got {text!r}")


def _field_type(tp: Any) -> tuple[Any, bool]:
    """(base type, optional) for a dataclass field annotation like `int | None`."""
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        return args[0], len(args) < len(get_args(tp))
    return tp, False


_FIELD = re.compile(r"^    (\w+)\s*:[^=#]*(?:=[^#]*)?(?:#\s*(.*))?$")
_COMMENT = re.compile(r"^    #\s?(.*)$")


def field_docs(cls: type) -> dict[str, str]:
    """{field: its comment} from the dataclass source: the comment after the field, or the
    comment lines right above it (`attention: str = "auto"` is explained above itself)."""
    try:
        lines = getsource(cls).splitlines()
    except (OSError, TypeError):  # no source (a zipped install): flags keep bare help
        return {}
    docs: dict[str, str] = {}
    above: list[str] = []
    for line in lines:
        comment = _COMMENT.match(line)
        if comment:
            above.append(comment.group(1).strip())
            continue
        field = _FIELD.match(line)
        if field and not line.lstrip().startswith(("def ", "@")):
            docs[field.group(1)] = (field.group(2) or " ".join(above)).strip()
        above = []
    return docs


def add_config_flags(parser: argparse.ArgumentParser, cls: type, title: str) -> None:
    """Add one `--field` flag per field of dataclass `cls` (default: keep the config's),
    its help the field's comment and the dataclass default."""
    group = parser.add_argument_group(title)
    hints = get_type_hints(cls)
    docs = field_docs(cls)
    for f in dataclasses.fields(cls):
        base, optional = _field_type(hints[f.name])
        if base is bool:
            convert: Any = _parse_bool
        elif base in (int, float, str):
            convert = base
        elif get_origin(base) in (dict, list):  # e.g. --rope_scaling '{"rope_type": ...}'
            convert = functools.partial(_parse_json, get_origin(base), f.name)
        else:
            continue
        if optional:
            inner = convert

            def convert(text: str, inner: Any = inner) -> Any:
                return None if text.lower() == "none" else inner(text)

        default = f.default if f.default is not dataclasses.MISSING else None
        doc = docs.get(f.name, "").replace("%", "%%")  # argparse formats help with %
        group.add_argument(
            f"--{f.name}", dest=f"{cls.__name__}.{f.name}", type=convert, default=None,
            metavar=getattr(get_origin(base) or base, "__name__", "VALUE").upper()
            .replace("DICT", "JSON").replace("LIST", "JSON"),
            help=f"{doc + ' ' if doc else ''}({cls.__name__} default: {default})",
        )


def _parse_json(kind: type, name: str, text: str) -> Any:
    """A JSON object/array flag value (or none)."""
    if text.lower() == "none":
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"--{name} takes JSON ({e})") from None
    if not isinstance(value, kind):
        raise argparse.ArgumentTypeError(f"--{name} takes a JSON {kind.__name__}, got {text}")
    return value


def config_overrides(args: argparse.Namespace, cls: type) -> dict[str, Any]:
    """The fields of `cls` given on the command line, as a dict."""
    prefix = f"{cls.__name__}."
    return {
        key[len(prefix):]: value
        for key, value in vars(args).items()
        if key.startswith(prefix) and value is not None
    }


def config_from_flags(args: argparse.Namespace, cls: type[T], base: T | None = None) -> T:
    """Build `cls` from `base` (or its defaults) with the flags given applied on top."""
    overrides = config_overrides(args, cls)
    if base is None:
        return cls(**overrides)
    return dataclasses.replace(base, **overrides)  # type: ignore[type-var]


def add_checkpoint_argument(parser: argparse.ArgumentParser) -> None:
    """The CHECKPOINT positional every command that loads a model takes (`load_checkpoint`)."""
    parser.add_argument("checkpoint", metavar="CHECKPOINT",
                        help="checkpoint directory, a run directory holding ckpt/, or a "
                        "Hugging Face model directory")


def count(n: int, noun: str, plural: str | None = None) -> str:
    """"1 layer", "12 layers" ("2 processes" with plural="processes")."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def unescape(text: str) -> str:
    r"""`\n` and `\t` typed on a command line as the newline and tab they stand for."""
    return text.replace("\\n", "\n").replace("\\t", "\t")


def text_ids(tokenizer: Any, text: str, block_size: int, what: str = "the text") -> list[int]:
    """`text`'s token ids, refused when empty or longer than the model reads (a silent cut
    would renumber every position the command reports)."""
    ids = list(tokenizer.encode(text))
    if not ids:
        raise CLIError(f"{what} has no tokens; pass some text")
    if len(ids) > block_size:
        raise CLIError(f"{what} is {len(ids)} tokens, the model reads at most "
                       f"block_size={block_size}; shorten it")
    return ids


def _check_device(args: argparse.Namespace) -> None:
    """Every command's --device, checked once before it runs: a device this machine lacks is
    named as such (loading weights onto it failed as "corrupted", pin_memory's error)."""
    device = getattr(args, "device", None) or getattr(args, "TrainConfig.device", None)
    if isinstance(device, str) and device not in ("cpu", "auto"):
        from ..distributed import resolve_device

        resolve_device(device)


class _Parser(argparse.ArgumentParser):
    """argparse with one-line usage errors: the full usage of `attnlab train` is dozens of
    lines that bury the one that says what was wrong (`--help` still shows it)."""

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
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _close_flags(flag: str, known: list[str]) -> list[str]:
    """Known flags close to a misspelt one (`--n_layers`, `--max-iters` -> `--max_iters`)."""
    name = flag.split("=", 1)[0]
    underscored = "--" + name.lstrip("-").replace("-", "_")
    if underscored in known:
        return [underscored]
    return difflib.get_close_matches(name, known, n=2, cutoff=0.75)


def known_flags(parser: argparse.ArgumentParser) -> list[str]:
    return sorted(s for a in parser._actions for s in a.option_strings if s.startswith("--"))


def _version() -> str:
    import platform

    import torch

    from .. import __version__

    return f"attnlab {__version__} (torch {torch.__version__}, Python {platform.python_version()})"


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    parser = _Parser(  # subcommand parsers take the same class
        prog="attnlab",
        description="Build, train, generate with and look inside causal attention models.",
    )
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    parsers: dict[str, argparse.ArgumentParser] = {}
    for name in COMMANDS:
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
    reuse_freed_memory()
    parser, parsers = build_parser()
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
    if unknown:
        known = known_flags(sub)
        hints = [f"{flag} (did you mean {' or '.join(close)}?)"
                 for flag in unknown if flag.startswith("-")
                 for close in [_close_flags(flag, known)] if close]
        print(
            f"attnlab {args.command}: unknown arguments {unknown}\n"
            + "".join(f"unknown  {hint}\n" for hint in hints)
            + f"known flags: {' '.join(known)}",
            file=sys.stderr,
        )
        return 2
    formatwarning = warnings.formatwarning  # library warnings as one line, like errors
    warnings.formatwarning = lambda message, *_, **__: (
        f"attnlab {args.command}: warning: {message}\n")
    try:
        _check_device(args)
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
    except KeyboardInterrupt:
        print(f"attnlab {args.command}: interrupted", file=sys.stderr)
        return 130
    finally:
        warnings.formatwarning = formatwarning


if __name__ == "__main__":
    sys.exit(main())
