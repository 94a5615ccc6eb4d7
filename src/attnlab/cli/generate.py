"""`attnlab generate CHECKPOINT "prompt"`: extend prompts with a trained model, streaming the text.

CHECKPOINT is an attnlab checkpoint directory or a Hugging Face model directory of a family
`attnlab.hf` supports (config.json + model.safetensors, with tokenizer.json). One prompt
streams to stdout as its tokens come; `--prompt-file` runs many prompts as left-padded
batches and prints each completion once its batch is done. Timing and progress (the
prefill, a batch's tokens, float16 packing) go to stderr, so stdout holds only text. The
sampling flags, and what a model directory's generation_config.json fills in, are
`sampling_flags.py`'s.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .common import (
    CLIError,
    add_checkpoint_argument,
    add_device_flags,
    add_threads_flag,
    add_weights_flag,
    apply_threads,
    check_weights_flag,
    count,
    cpu_memory_errors,
    device_of,
    load_opened,
    open_model,
    out_of_memory,
    unescape,
)
from .progress import Counter, blocks_shown
from .sampling_flags import add_sampling_flags, check_sampling_flags, fill_sampling

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..tokenizers.streaming import TextPieces


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "generate",
        help="extend a prompt with a trained model (streams text as it comes)",
        description="Extend PROMPT (or every line of --prompt-file) with the model in "
        "CHECKPOINT: an attnlab checkpoint or a Hugging Face model directory (GPT-2, Llama, "
        "Mistral, Qwen2, Qwen3, GPT-NeoX).",
    )
    add_checkpoint_argument(parser)
    parser.add_argument(
        "prompt", nargs="?", default=None,
        help="text to continue (empty: start from the tokenizer's begin- or end-of-text)",
    )
    parser.add_argument(
        "--prompt-file",
        help="a file with one prompt per line (- reads stdin); they run as batches",
    )
    parser.add_argument(
        "--max-new-tokens", type=int,
        help="tokens to add (default: 200, or as many as the context has room for)",
    )
    add_sampling_flags(parser)
    parser.add_argument("--seed", type=int, help="same seed, same text")
    parser.add_argument(
        "--stop", action="append", default=[],
        help="end a completion at this string (repeatable; \\n and \\t are understood)",
    )
    parser.add_argument(
        "--sliding-window", action="store_true",
        help="past block_size, condition on the last block_size tokens instead of failing "
        "(a window over the text fed in; not the model's attention window, which is its "
        "config's sliding_window, set by train --sliding_window N)",
    )
    parser.add_argument(
        "--batch-size", type=int, default=None,
        help="prompts per batch with --prompt-file (default 16)",
    )
    add_device_flags(
        parser, "weights and activations; bfloat16 and float16 halve the bytes read per token: "
        "on a GPU, and for large models on a CPU whose bfloat16 kernels keep up (AMX: yes; "
        "measure yours) (default float32)")
    add_weights_flag(parser)
    add_threads_flag(parser)
    parser.add_argument("--compile", action="store_true", help="decode through a compiled "
                        "fixed-shape step (CUDA graphs on a GPU; docs/generate.md)")
    parser.add_argument(
        "--chat", action="store_true",
        help="send each prompt as a user message in the model's chat template (an "
        "instruct model's tokenizer_config.json), as transformers' apply_chat_template "
        "does; prints the answer",
    )
    parser.add_argument("--system", help="with --chat: a system message before each prompt")
    parser.add_argument(
        "--chat-var", action="append", default=[], metavar="NAME=VALUE",
        help="with --chat: a variable of the chat template, as apply_chat_template's keyword "
        "arguments (VALUE read as JSON where it parses: true, false, numbers), e.g. "
        "enable_thinking=false for Qwen3; repeat for several",
    )
    parser.add_argument(
        "--ablate", metavar="L.H[,L.H]",
        help="zero these heads' outputs while generating, e.g. 0.1,1.3 (see attnlab heads)",
    )
    return parser


def _read_prompts(args: argparse.Namespace) -> list[str]:
    if args.prompt_file is None:
        return [args.prompt or ""]
    if args.prompt is not None:
        raise CLIError("give PROMPT or --prompt-file, not both")
    if args.prompt_file == "-":
        text = sys.stdin.read()
    else:
        path = Path(args.prompt_file)
        if not path.is_file():
            raise CLIError(f"--prompt-file {path} " + ("is a directory; give a text file with "
                           "one prompt per line" if path.is_dir() else "does not exist"))
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as err:
            raise CLIError(
                f"--prompt-file {path} is not UTF-8 text (byte {err.object[err.start]:#04x} at "
                f"offset {err.start}); give a text file with one prompt per line"
            ) from None
    if "\x00" in text:
        raise CLIError(f"--prompt-file {args.prompt_file} holds NUL bytes: it is binary, not "
                       "text with one prompt per line")
    prompts = [line for line in text.splitlines() if line.strip()]
    if not prompts:
        raise CLIError(f"--prompt-file {args.prompt_file} has no non-empty lines")
    return prompts


def _row_seed(seed: int, index: int) -> int:
    """The seed of the prompt at `index` in a --prompt-file: `seed` for the first (so it
    matches the same prompt given alone), a hash of (seed, index) for the others (seed + index
    would give --seed 2's first prompt the draws of --seed 1's second)."""
    import numpy as np

    if index == 0:
        return seed
    return int(np.random.SeedSequence([seed, index]).generate_state(1, np.uint64)[0] >> 1)


def _chat_prompts(tokenizer: Any, prompts: list[str], args: argparse.Namespace) -> list[str]:
    """Each prompt as a user message (after --system) in the tokenizer's chat template."""
    if not callable(getattr(tokenizer, "chat_prompt", None)) or not tokenizer.chat:
        raise CLIError(f"--chat: {args.checkpoint}'s tokenizer has no chat template "
                       "(tokenizer_config.json 'chat_template' or chat_template.jinja); "
                       "drop --chat to continue the text as it is")
    system = [] if args.system is None else [{"role": "system", "content": args.system}]
    variables = dict(_chat_var(item) for item in args.chat_var)
    try:
        return [tokenizer.chat_prompt([*system, {"role": "user", "content": p}], **variables)
                for p in prompts]
    except ValueError as err:
        raise CLIError(f"--chat: {err}") from None


def _chat_var(item: str) -> tuple[str, Any]:
    """"enable_thinking=false" -> ("enable_thinking", False); a VALUE that is not JSON stays
    text."""
    name, sep, value = item.partition("=")
    if not sep or not name.isidentifier() or name in ("messages", "add_generation_prompt"):
        raise CLIError(f"--chat-var {item!r}: give NAME=VALUE with NAME a template variable, "
                       "e.g. --chat-var enable_thinking=false")
    try:
        return name, json.loads(value)
    except json.JSONDecodeError:
        return name, value


def run(args: argparse.Namespace) -> int:
    import torch

    from ..generate import stream_text

    _check_flags(args)
    shown = _read_prompts(args)  # what the user wrote: echoed before each completion
    opened = open_model(args)  # config and tokenizer: the request is checked before the load
    fill_sampling(args, opened.path)
    tokenizer = opened.tokenizer
    prompts = _chat_prompts(tokenizer, shown, args) if args.chat else shown
    lengths = _prompt_lengths(args, tokenizer, prompts)
    max_new_tokens = _max_new_tokens(args, opened.config.block_size, lengths)
    stops = [unescape(s) for s in args.stop]
    edits = _ablation(args.ablate, opened.config)
    model = _load_model(args, opened, min(len(prompts), args.batch_size),
                        max(*lengths, 1) + max_new_tokens, max(*lengths, 1))

    def completions(prompts: list[str], first: int = 0) -> TextPieces:
        seeds: dict[str, Any] = {"seed": args.seed}
        if args.prompt_file is not None and args.seed is not None:
            # prompt i draws from its own seeded generator: the same completions whatever
            # --batch-size groups them into, and a repeated prompt gets fresh draws
            seeds = {"row_seeds": [_row_seed(args.seed, i)
                                   for i in range(first, first + len(prompts))]}
        return stream_text(
            model, tokenizer, prompts, max_new_tokens=max_new_tokens, stop=stops,
            temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
            typical_p=args.typical_p, repetition_penalty=args.repetition_penalty,
            no_repeat_ngram_size=args.no_repeat_ngram_size, sliding_window=args.sliding_window,
            edits=edits, compile=args.compile, **seeds,
        )

    start = time.perf_counter()
    try:
        with cpu_memory_errors():
            if args.prompt_file is None:
                streamed = completions(prompts)  # checks the request before the prompt is echoed
                produced = _stream(streamed, shown[0] + "\n" if args.chat else shown[0],
                                   model, args.compile)
            else:
                produced = _print_batches(completions, prompts, shown, args, model,
                                          max_new_tokens)
    except KeyboardInterrupt:
        sys.stdout.write("\n")  # the shell's prompt on a line of its own
        raise
    except torch.OutOfMemoryError as err:
        sys.stdout.write("\n")  # the streamed text ends where memory did
        raise out_of_memory("generate", err, model.wte.weight.device) from None
    seconds = time.perf_counter() - start
    rate = produced / max(seconds, 1e-9)
    print(f"[{count(produced, 'new token')} in {seconds:.2f} s, {rate:,.1f} tokens/s]",
          file=sys.stderr)
    if args.compile:
        _report_compiled(model)
    return 0


def _report_compiled(model: Any) -> None:
    """Say on stderr what compiling the decode step cost (its first call, in the time above)."""
    from ..model.compiled_decode import compiled_decodes

    for step in compiled_decodes(model):
        if step.compile_seconds is not None:
            graph = "a CUDA graph" if step.cuda_graph else "no CUDA graph"
            print(f"[decode step for {count(step.batch_size, 'row')} x {step.max_len} cache "
                  f"slots compiled in {step.compile_seconds:.1f} s (its first call; {graph})]",
                  file=sys.stderr)


def _check_flags(args: argparse.Namespace) -> None:
    """Apply --threads and --batch-size's default; refuse flags that contradict each other,
    before the model is loaded."""
    apply_threads(args, share=True)
    check_sampling_flags(args)
    if args.batch_size is not None and args.prompt_file is None:
        raise CLIError(f"--batch-size {args.batch_size} groups the prompts of --prompt-file; "
                       "one PROMPT runs alone (drop --batch-size)")
    args.batch_size = 16 if args.batch_size is None else args.batch_size
    if args.batch_size < 1:
        raise CLIError(f"--batch-size {args.batch_size} must be >= 1")
    if args.seed is not None and not 0 <= args.seed < 2**64:
        raise CLIError(f"--seed {args.seed} is out of range; use 0 to 2**64 - 1")
    if "" in args.stop:
        raise CLIError("--stop '': an empty stop string matches nothing; give some text")
    if args.system is not None and not args.chat:
        raise CLIError("--system goes with --chat (a system message in the chat template)")
    if args.chat_var and not args.chat:
        raise CLIError("--chat-var goes with --chat (a variable of the chat template)")
    check_weights_flag(args)
    if args.compile and args.weights == "float16":
        raise CLIError("--compile reads the model's own weights, --weights float16 packed "
                       "copies; drop one of them")


def _load_model(args: argparse.Namespace, opened: Any, rows: int, length: int,
                prompt: int) -> Any:
    """The model on --device in --dtype, with --weights float16 packed, once it fits with
    what generating `rows` rows of `length` tokens from prompts of up to `prompt` allocates
    beside it (the KV cache, the decode step's matrices, a capped model's prefill scores,
    the packed copies: `generation_memory`)."""
    from ..generate import generation_memory
    from ..model.decode import half_weights
    from ..model.runtime import warn_if_slow_bf16

    uses = generation_memory(opened.weights.model, rows, length, prompt=prompt,
                             device=device_of(args), float16_weights=args.weights == "float16")
    model = load_opened(args, opened, uses).model
    warn_if_slow_bf16(args.dtype, model.wte.weight.device)
    if args.weights == "float16":
        began = time.perf_counter()
        with Counter("tensor", "float16 packing", delay_s=2.0) as progress:
            half_weights(model, progress=progress)  # large models: long enough to show
        print(f"[float16 weights packed in {time.perf_counter() - began:.1f} s]", file=sys.stderr)
    return model


def _prompt_lengths(args: argparse.Namespace, tokenizer: Any, prompts: list[str]) -> list[int]:
    """Tokens per prompt; a prompt the tokenizer cannot encode is refused by its number."""
    lengths = []
    for i, prompt in enumerate(prompts):
        try:
            lengths.append(len(tokenizer.encode(prompt)))
        except ValueError as err:
            where = "" if args.prompt_file is None else f"prompt {i + 1}/{len(prompts)}: "
            raise CLIError(f"{where}{err}") from None
    start = getattr(tokenizer, "bos_id", None)  # what an empty prompt starts from (generate)
    start = getattr(tokenizer, "eot_id", None) if start is None else start
    if min(lengths) == 0 and start is None:
        raise CLIError(f"PROMPT is empty, and tokenizer {tokenizer.name!r} has no begin- or "
                       "end-of-text token to start from; give a prompt: attnlab generate "
                       f"{args.checkpoint} 'some text'")
    return lengths


def _max_new_tokens(args: argparse.Namespace, block: int, lengths: list[int]) -> int:
    """--max-new-tokens, or a default that fits the context (`block` tokens) after prompts of
    `lengths` tokens; a prompt that leaves no room is refused by its number."""
    max_new_tokens: int | None = args.max_new_tokens
    if max_new_tokens is None and args.sliding_window:
        max_new_tokens = 200
    elif max_new_tokens is None:
        longest = max(max(lengths), 1)
        # the default fits the context (the last new token is never fed back); ask for more
        # with --max-new-tokens and --sliding-window
        max_new_tokens = max(1, min(200, block - longest + 1))
    for i, n in enumerate(lengths):  # before the first batch runs: name the prompt
        if not args.sliding_window and max(n, 1) + max_new_tokens - 1 > block:
            where = "the prompt" if args.prompt_file is None else f"prompt {i + 1}/{len(lengths)}"
            fix = ("lower --max-new-tokens, shorten it" if args.max_new_tokens is not None
                   else "shorten it")
            raise CLIError(f"{where} has {count(n, 'token')}; with "
                           f"{count(max_new_tokens, 'new token')} it runs past the model's "
                           f"context (block_size={block}); "
                           f"{fix}, or pass --sliding-window to condition on the last "
                           f"{block} tokens")
    return max_new_tokens


def _ablation(heads_text: str | None, config: Any) -> Any:
    """The edits that zero --ablate's heads, or None."""
    if heads_text is None:  # "" is ablated too: ablating nothing would pass for an answer
        return None
    from ..interp.edits import ablate, check_heads, parse_heads

    heads = parse_heads(heads_text)
    check_heads(heads, config.n_layer, config.n_head)
    return ablate(heads)


def _stream(streamed: TextPieces, echo: str, model: Any, compiled: bool = False) -> int:
    """Write `echo`, then one completion's text to stdout as it comes: the tokens made.
    The prefill runs first, its blocks counted on stderr (a long prompt on a large model:
    minutes on a CPU), so the bar never shares the echo's line; with `compiled` the second
    token too, whose step compiles on its first call."""
    steps = iter(streamed)
    with blocks_shown(model, "prefilled"):
        first = next(steps, None)  # the prefill and the first new token
    held = [] if first is None else [first]
    if compiled and first is not None:
        print("[compiling the decode step: its first call takes tens of seconds]",
              file=sys.stderr, flush=True)
        held += [] if (second := next(steps, None)) is None else [second]
    sys.stdout.write(echo)
    sys.stdout.flush()
    for pieces in itertools.chain(held, steps):
        if pieces[0]:
            sys.stdout.write(pieces[0])
            sys.stdout.flush()
    sys.stdout.write("\n")
    return sum(streamed.made)


def _print_batches(completions: Callable[[list[str], int], TextPieces],
                   prompts: list[str], shown: list[str], args: argparse.Namespace,
                   model: Any, max_new_tokens: int) -> int:
    """Run the prompts in batches of --batch-size, printing each completion once its batch
    is done: the tokens made (a row's pads after its stop id not counted). Meanwhile stderr
    counts the batch's prefill blocks, then its steps (max_new_tokens at most)."""
    produced = 0
    for first in range(0, len(prompts), args.batch_size):
        batch = prompts[first:first + args.batch_size]
        texts = [""] * len(batch)
        streamed = completions(batch, first)
        steps = iter(streamed)
        with blocks_shown(model, "prefilled"):
            pieces = next(steps, None)
        done = 0
        with Counter("token", "generated", delay_s=2.0) as progress:
            while pieces is not None:
                texts = [t + p for t, p in zip(texts, pieces, strict=True)]
                done += 1
                progress(done, max_new_tokens)
                pieces = next(steps, None)
        produced += sum(streamed.made)
        for i, completion in enumerate(texts):
            print(f"=== prompt {first + i + 1}/{len(prompts)}")
            prompt = shown[first + i]
            print(f"{prompt}\n{completion}" if args.chat else prompt + completion)
    return produced
