"""What every subcommand shares: `CLIError`, config dataclasses as flags (`add_config_flags`,
`config_from_flags`), either spelling of a flag (`spell_flags`), `~` in paths
(`expand_paths`), the checkpoint argument, the device and dtype flags of every command that
runs a model (`add_device_flags`, `device_of`; `open_model` and `load_opened`, or
`load_model` for both, which word a refusal in the command's own flags), --weights of the
commands that decode (`add_weights_flag`, `check_weights_flag`), --threads
(`add_threads_flag`, `apply_threads`), the one line a command prints when the device runs out
of memory (`out_of_memory`), a Ctrl-C held over what it must not cut short
(`interrupts_held`), and small text helpers. The parser and `main` are the package's
`__init__`."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import os
import re
import signal
import sys
import threading
import types
from collections.abc import Iterator, Sequence
from inspect import getsource  # (`import inspect` would be shadowed by cli/inspect.py)
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, Union, get_args, get_origin, get_type_hints

if TYPE_CHECKING:
    import torch

    from ..checkpoint import Checkpoint, OpenedCheckpoint
    from ..model.memory import Use

T = TypeVar("T")


class CLIError(Exception):
    """A user error the CLI reports in one line, without a traceback."""


@contextlib.contextmanager
def interrupts_held() -> Iterator[None]:
    """Hold a Ctrl-C until the block is done, then raise it (KeyboardInterrupt): for imports
    of torch (numpy, attnlab's model). Raised inside one, in a C extension's initialisation,
    the interrupt left a half-imported numpy ("cannot load module more than once"), an abort
    in pybind11, or was swallowed, and `generate` or `train` went on (tests/cli/
    test_cli_main.py, under load). A SIGINT ignored (a background job's) stays ignored."""
    if threading.current_thread() is not threading.main_thread():  # no handler to set there
        yield
        return
    held: list[int] = []
    old = signal.signal(signal.SIGINT, lambda signum, frame: held.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old if old is not None else signal.default_int_handler)
    if held and old is not signal.SIG_IGN:
        raise KeyboardInterrupt


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
        # `--compile` alone is `--compile true`, as the other commands' switches read
        alone: dict[str, Any] = {"nargs": "?", "const": True} if base is bool else {}
        group.add_argument(
            f"--{f.name}", dest=f"{cls.__name__}.{f.name}", type=convert, default=None,
            metavar=getattr(get_origin(base) or base, "__name__", "VALUE").upper()
            .replace("DICT", "JSON").replace("LIST", "JSON"),
            help=f"{doc + ' ' if doc else ''}({cls.__name__} default: {default}"
            f"{'; alone: true' if alone else ''})", **alone,
        )


def spell_flags(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """`argv` with each flag of `parser` in the spelling it was added with: every command takes
    `--max-new-tokens` and `--max_new_tokens` alike (train's flags are its config fields, with
    `_`; the other commands' are written with `-`), and its --help shows one spelling."""
    spelt = {flag.replace("_", "-"): flag for action in parser._actions
             for flag in action.option_strings if flag.startswith("--")}
    out: list[str] = []
    for i, word in enumerate(argv):
        if word == "--":  # what follows is positional, whatever it looks like
            return out + argv[i:]
        name, equals, value = word.partition("=")
        if name.startswith("--"):
            name = spelt.get(name.replace("_", "-"), name)
        out.append(name + equals + value)
    return out


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


#: the arguments that name a file or directory, in whichever command takes them
PATH_ARGUMENTS = ("checkpoint", "out", "prompt_file", "data", "init_from", "tokenizer")


def expand_paths(args: argparse.Namespace) -> None:
    """`~` at the start of a path argument, as a shell expands it where it is not quoted: a
    quoted "~/runs/copy", or --out=~/figures, reached the command as it was written."""
    for name in PATH_ARGUMENTS:
        value = getattr(args, name, None)
        if isinstance(value, str) and value.startswith("~"):
            setattr(args, name, os.path.expanduser(value))


#: --dtype's choices: what the model's weights and activations are held in (as names, so the
#: parser imports no torch; memory.LOAD_DTYPES holds the same, tested)
DTYPES = ("float32", "bfloat16", "float16")
DEVICE_HELP = ("auto (CUDA when present, else the CPU), cpu, cuda, cuda:N or mps "
               "(default auto)")


def add_device_flags(parser: argparse.ArgumentParser, dtype_help: str = "",
                     dtypes: tuple[str, ...] = DTYPES, force: bool = True) -> None:
    """--device (default auto), --dtype (default float32, one of `dtypes`) and, with `force`,
    --force of a command that loads a model."""
    parser.add_argument("--device", default="auto", help=DEVICE_HELP)
    parser.add_argument(
        "--dtype", choices=dtypes, default="float32",
        help=dtype_help or "the model's weights and activations; bfloat16 and float16 halve "
        "the memory, and run fastest on a GPU (default float32)")
    if force:
        add_force_flag(parser)


def add_weights_flag(parser: argparse.ArgumentParser) -> None:
    """--weights of a command that decodes (`check_weights_flag` checks it)."""
    parser.add_argument(
        "--weights", choices=("float32", "float16"), default="float32",
        help="float16: round every matrix to float16 and stream 2 bytes per weight in "
        "decode, arithmetic still float32 (x86 CPUs; 1.4-2.2x tokens/s for GPT-2 small here, "
        "after ~2 s of packing) (default float32)",
    )


def check_weights_flag(args: argparse.Namespace) -> None:
    """Refuse --weights float16 where its packed copies cannot run: they are float32
    arithmetic in CPU kernels (fbgemm, `model.decode.half_weights`)."""
    if args.weights != "float16":
        return
    if args.dtype != "float32":
        raise CLIError(f"--weights float16 computes in float32; drop --dtype {args.dtype}")
    if device_of(args).type != "cpu":
        raise CLIError(f"--weights float16 packs the matrices for CPU kernels (fbgemm); on "
                       f"{device_of(args)} use --dtype float16 or bfloat16 instead")


THREADS_HELP = ("CPU threads for torch (default: torch's choice, one per physical core, "
                "fewer where other work keeps cores busy; small models are often fastest "
                "with 1)")


def add_threads_flag(parser: argparse.ArgumentParser, help_text: str = THREADS_HELP) -> None:
    """--threads of a command that runs torch on the CPU (`apply_threads` checks and sets it)."""
    parser.add_argument("--threads", type=int, metavar="N", help=help_text)


def apply_threads(args: argparse.Namespace, *, share: bool = False) -> None:
    """Hand --threads to torch, refused in one line below 1; none given: torch's choice, or
    with `share` fewer where other work keeps cores busy (`runtime.shared_threads`; a line
    on a terminal's stderr says so)."""
    if args.threads is None:
        if share:
            _share_cores()
        return
    if args.threads < 1:
        raise CLIError(f"--threads {args.threads} must be >= 1; leave it out for torch's choice")
    import torch

    torch.set_num_threads(args.threads)


def _share_cores() -> None:
    """torch's threads cut to the cores other work leaves idle, where that is fewer."""
    import torch

    from ..model.runtime import busy_cores, shared_threads

    threads = torch.get_num_threads()
    busy = busy_cores() if threads > 1 else None
    if busy is None:
        return
    cores = os.cpu_count() or 1
    fewer = shared_threads(threads, busy, cores)
    if fewer < threads:
        torch.set_num_threads(fewer)
    if fewer < threads and sys.stderr.isatty():  # a person at a terminal; not a script's log
        print(f"note: other work keeps {busy:.1f} of this machine's {cores} cores busy, so "
              f"torch runs {fewer} thread{'s' if fewer != 1 else ''}, not {threads} (threads "
              "that share a core wait on each other); --threads N chooses", file=sys.stderr)


def add_force_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--force", action="store_true",
        help="load the model even where the memory the device has free looks too small for "
        "it (by default a model that cannot fit is refused in one line before loading)")


def check_device(name: str) -> torch.device:
    """The device --device names (auto: cuda:0 where CUDA is, else cpu), or a ValueError in
    one line for one this machine lacks: no CUDA, no MPS, or cuda:7 on a one-GPU machine."""
    import torch

    from ..model.runtime import resolve_device

    device = resolve_device(name)
    if device.type == "cuda" and device.index is not None:
        count_ = torch.cuda.device_count()
        if device.index >= count_:
            have = ", ".join(f"cuda:{i}" for i in range(count_))
            raise ValueError(f"device={name!r} but this machine has {count(count_, 'CUDA device')}"
                             f" ({have}); use one of those, or auto")
    return device


def device_of(args: argparse.Namespace) -> torch.device:
    """The device the command's --device names (checked by `check_device`)."""
    return check_device(args.device)


def dtype_of(args: argparse.Namespace) -> torch.dtype:
    """The torch dtype the command's --dtype names (float32 for a command without one)."""
    import torch

    dtype: torch.dtype = getattr(torch, getattr(args, "dtype", "float32"))
    return dtype


def open_model(args: argparse.Namespace) -> OpenedCheckpoint:
    """The directory args.checkpoint names, opened and checked (config, weight headers,
    tokenizer), nothing loaded: what a command sizes its work by before `load_opened`."""
    from ..load import open_checkpoint

    return open_checkpoint(args.checkpoint)


def load_opened(args: argparse.Namespace, opened: OpenedCheckpoint,
                uses: Sequence[Use] = ()) -> Checkpoint:
    """`opened` loaded onto --device in --dtype, once it fits with `uses` beside it (or
    --force). A refusal names only the flags this command has; running out of memory while
    loading says so, not what the command would reduce once running."""
    import torch

    from ..model.memory import DoesNotFitError
    from ..model.packed import packed_layers
    from .progress import Counter

    device = device_of(args) if hasattr(args, "device") else torch.device("cpu")
    try:
        with Counter("tensor", "loaded", delay_s=2.0) as progress, cpu_memory_errors():
            # a large model takes a while: the bar
            checkpoint = opened.load(map_location=device, dtype=dtype_of(args),
                                     force=getattr(args, "force", False), progress=progress,
                                     uses=uses)
    except DoesNotFitError as err:
        raise CLIError(err.advice(
            dtype="--dtype bfloat16" if hasattr(args, "dtype") else None,
            force="--force" if hasattr(args, "force") else None)) from None
    except torch.OutOfMemoryError as err:
        fix = "a device with more free memory, or a smaller model"
        if hasattr(args, "dtype") and args.dtype == "float32":
            fix = "--dtype bfloat16, " + fix
        raise out_of_memory("load", err, device, hint=fix) from None
    packed = packed_layers(checkpoint.model)
    if packed:
        print(f"attnlab: its dequantized weights would not fit in memory, so {len(packed):,} "
              f"{packed[0].holds} stay packed as {packed[0].kind} (the same logits, slower "
              "products)",
              file=sys.stderr)
    return checkpoint


def load_model(args: argparse.Namespace, uses: Sequence[Use] = ()) -> Checkpoint:
    """The checkpoint args.checkpoint names, loaded onto --device in --dtype (`open_model`,
    then `load_opened`)."""
    return load_opened(args, open_model(args), uses)


#: what each command can do with less memory, for `out_of_memory`'s line
MEMORY_HINTS = {
    "train": "a smaller --batch_size (with --grad_accum to keep the batch), a shorter context "
             "(--block_size or --seq_len), or --dtype bfloat16",
    "generate": "a smaller --batch-size, fewer --max-new-tokens, shorter prompts, or --dtype "
                "bfloat16",
    "inspect": "fewer traced layers or heads (--layer, --head), fewer figures (--what), a "
               "shorter text, or --dtype bfloat16",
}


@contextlib.contextmanager
def cpu_memory_errors() -> Iterator[None]:
    """Raise the CPU allocator's failure, a plain RuntimeError, as torch.OutOfMemoryError,
    so that one handler names what to reduce on any device."""
    import torch

    try:
        yield
    except RuntimeError as err:
        text = str(err)
        if isinstance(err, torch.OutOfMemoryError) or "can't allocate memory" not in text:
            raise
        # "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate
        # memory: you tried to allocate N bytes. Error code 12 (...)": the bytes are the news
        said = text.split("DefaultCPUAllocator: ")[-1].split(". ")[0]
        raise torch.OutOfMemoryError(said) from err


def out_of_memory(command: str, err: BaseException, device: Any = None,
                  hint: str | None = None) -> CLIError:
    """The one line `attnlab COMMAND` says when the device ran out of memory: on which device,
    and what to reduce (`hint`, else the command's MEMORY_HINTS; command "load": while the
    model was loaded). Frees what the CUDA allocator caches first."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    where = f" on {device}" if device is not None else ""
    where += " while loading the model" if command == "load" else ""
    hint = hint or MEMORY_HINTS.get(command, "a smaller input, or --dtype bfloat16")
    # torch's CUDA message goes on about the allocator; its first two sentences say how much
    said = ". ".join(str(err).split("\n")[0].split(". ")[:2]).rstrip(".") or type(err).__name__
    return CLIError(f"out of memory{where} ({said}); try {hint}")


def check_out(path: str | Path, flag: str = "--out") -> Path:
    """The directory a command will write to, checked before any work whose results it would
    lose: a file there is named with the fix. (It is made when the first file is written,
    so a command that fails leaves no empty directory.)"""
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise CLIError(f"{flag} {out} is a file; give a directory (it is created if missing)")
    there = out.absolute()
    while not there.exists():  # the directory it would be made in
        there = there.parent
    if not there.is_dir():
        raise CLIError(f"{flag} {out}: {there} is a file, so no directory can be made "
                       "below it; give another path")
    if not os.access(there, os.W_OK | os.X_OK):
        raise CLIError(f"{flag} {out}: {there} is not writable; give a directory you can "
                       "write to")
    return out


def count(n: int, noun: str, plural: str | None = None) -> str:
    """"1 layer", "12 layers" ("2 processes" with plural="processes")."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def unescape(text: str) -> str:
    r"""`\n` and `\t` typed on a command line as the newline and tab they stand for."""
    return text.replace("\\n", "\n").replace("\\t", "\t")


def text_ids(tokenizer: Any, text: str, block_size: int, what: str = "the text") -> list[int]:
    """`text`'s token ids, refused when empty or longer than the model reads (a silent cut
    would renumber every position the command reports)."""
    try:
        ids = list(tokenizer.encode(text))
    except ValueError as err:  # which input could not be encoded, then what
        raise CLIError(f"{what}: {err}") from None
    if not ids:
        raise CLIError(f"{what} has no tokens; pass some text")
    if len(ids) > block_size:
        raise CLIError(f"{what} is {len(ids)} tokens, the model reads at most "
                       f"block_size={block_size}; shorten it")
    return ids
