"""`attnlab generate`'s sampling flags: how they are declared, checked and filled in.

--temperature, --top-k, --top-p, --min-p, --typical-p, --repetition-penalty and
--no-repeat-ngram-size (`SAMPLING`'s names; either spelling, `--top-k` or `--top_k`) are
checked as `generate.GenerationConfig` checks them, the message naming the flag; those left
out are filled from a Hugging Face directory's generation_config.json as transformers'
generate() reads it, else from `SAMPLING`. What the values do is `generate/sampling.py`'s;
the rest of the command (prompts, batches, streaming) is `cli/generate.py`'s.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from .common import CLIError

#: the sampling flags and their defaults where neither they nor the model directory say
SAMPLING = {"temperature": 0.8, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "typical_p": 1.0,
            "repetition_penalty": 1.0, "no_repeat_ngram_size": 0}
#: what transformers' generate() samples with where a generation_config.json that sets
#: do_sample leaves a field out (GenerationConfig's defaults)
HF_SAMPLING = {"temperature": 1.0, "top_k": 50, "top_p": 1.0, "min_p": 0.0, "typical_p": 1.0,
               "repetition_penalty": 1.0, "no_repeat_ngram_size": 0}
#: each field's value that changes nothing: what transformers makes of a field set to null
#: (its processor is left out)
OFF = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "typical_p": 1.0,
       "repetition_penalty": 1.0, "no_repeat_ngram_size": 0}
#: the fields transformers applies whether it samples or not (logits processors, not warpers)
ALWAYS = ("repetition_penalty", "no_repeat_ngram_size")
#: the fields greedy decoding ignores (warpers: transformers builds them only with do_sample)
WARPERS = ("top_k", "top_p", "min_p", "typical_p")


def add_sampling_flags(parser: argparse.ArgumentParser) -> None:
    """`SAMPLING`'s flags, None when not given (`fill_sampling` fills them)."""
    parser.add_argument(
        "--temperature", type=float,
        help="0 = greedy, which ignores --top-k, --top-p, --min-p and --typical-p (default "
        "0.8, or what the model directory's generation_config.json sets: see "
        "docs/generate.md)",
    )
    parser.add_argument(
        "--top-k", type=int,
        help="sample among the k most likely tokens (default 0: all)",
    )
    parser.add_argument(
        "--top-p", type=float,
        help="nucleus sampling: smallest set of tokens holding this mass (default 1: all)",
    )
    parser.add_argument(
        "--min-p", type=float,
        help="sample only tokens at least this fraction as likely as the most likely one, "
        "after --top-k and --top-p (default 0: all)",
    )
    parser.add_argument(
        "--typical-p", type=float,
        help="typical sampling, after --min-p: the tokens whose surprisal is nearest the "
        "entropy, holding this mass (default 1: all; transformers' typical_p)",
    )
    parser.add_argument(
        "--repetition-penalty", type=float,
        help="divide the logits of tokens already in the prompt or the completion by this "
        "(multiply negative ones), greedy or not, as transformers does (default 1: off; "
        "1.1-1.3 discourages repeats)",
    )
    parser.add_argument(
        "--no-repeat-ngram-size", type=int,
        help="never make an n-gram of this many tokens that the prompt or the completion "
        "already holds, greedy or not, as transformers does (default 0: off)",
    )


def check_sampling_flags(args: argparse.Namespace, source: str = "--") -> None:
    """--max-new-tokens and the sampling flags (`SAMPLING`), checked as GenerationConfig checks
    them; its message names the field (`top_k=-1 must be ...`), this one the flag (or, with
    `source`, the file a value came from). A flag not given is checked at its default."""
    from ..generate import GenerationConfig

    given = {"max_new_tokens": 1 if args.max_new_tokens is None else args.max_new_tokens,
             **{name: value for name in SAMPLING
                if (value := getattr(args, name)) is not None}}
    try:
        GenerationConfig(**given)
    except ValueError as err:
        field, _, rest = str(err).partition("=")
        if field not in given:
            raise
        name = f"--{field.replace('_', '-')}" if source == "--" else f"{source}'s {field}"
        raise CLIError(f"{name} {rest}") from None


def from_generation_config(shipped: dict[str, Any]) -> dict[str, Any]:
    """The sampling fields a generation_config.json sets, as transformers' generate() reads
    it: do_sample false is greedy (temperature 0), do_sample true samples with its
    temperature, top_k, top_p, min_p and typical_p (HF_SAMPLING's where it leaves one out).
    Its repetition_penalty and no_repeat_ngram_size apply either way, and without do_sample:
    transformers runs those processors for greedy decoding too."""
    def value(name: str) -> Any:
        return OFF[name] if (v := shipped.get(name, HF_SAMPLING[name])) is None else v

    taken: dict[str, Any] = {}
    do_sample = shipped.get("do_sample")
    if do_sample is False:
        taken["temperature"] = 0.0
    elif do_sample is True:
        taken = {name: value(name) for name in SAMPLING if name not in ALWAYS}
    for name in ALWAYS:
        if name in shipped:
            taken[name] = value(name)
    return taken


def fill_sampling(args: argparse.Namespace, directory: Path) -> None:
    """Fill the sampling flags not given: from the directory's generation_config.json
    (`from_generation_config`), else SAMPLING. Says on stderr what came from the file."""
    from ..tokenizers.hf_dir import GENERATION_CONFIG, read_json

    path = directory / GENERATION_CONFIG
    try:
        shipped = read_json(path)
    except ValueError as err:
        raise CLIError(f"{err}; fix or remove it") from None
    given = [name for name in SAMPLING if getattr(args, name) is not None]
    taken = {name: value for name, value in from_generation_config(shipped).items()
             if name not in given}
    if taken:
        for name, value in taken.items():
            setattr(args, name, value)
        check_sampling_flags(args, source=str(path))
        said = ", ".join("greedy" if (name, value) == ("temperature", 0) else f"{name} {value}"
                         for name, value in taken.items())
        print(f"[sampling: {said}, from {GENERATION_CONFIG} where no flag says; flags "
              "override]", file=sys.stderr)
    for name, value in SAMPLING.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.temperature == 0 and set(WARPERS) & set(given):
        print("[temperature 0 is greedy: --top-k, --top-p, --min-p and --typical-p do "
              "nothing]", file=sys.stderr)
