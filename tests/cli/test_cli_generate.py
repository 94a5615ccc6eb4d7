"""`attnlab generate` end to end, in-process, on checkpoints built here (nothing is trained)."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import attnlab.generate as generate_mod
from attnlab import GPT, GPTConfig
from attnlab.checkpoint import save_checkpoint
from attnlab.cli import main
from attnlab.generate import generate_text
from attnlab.model import runtime
from attnlab.tokenizers import Tokenizer, get_tokenizer
from helpers import generate_flag_runs

TEXT = "the quick brown fox jumps over the lazy dog\n"


def _model_and_tokenizer(tokenizer: Tokenizer, block_size: int = 32) -> GPT:
    torch.manual_seed(0)
    config = GPTConfig.from_name(
        "nano", vocab_size=tokenizer.vocab_size, block_size=block_size, init_std=0.3
    )
    return GPT(config).eval()


@pytest.fixture
def checkpoint(tmp_path: Path) -> tuple[Path, GPT, Tokenizer]:
    tokenizer = get_tokenizer("char", TEXT)
    model = _model_and_tokenizer(tokenizer)
    return save_checkpoint(tmp_path / "ckpt", model, tokenizer), model, tokenizer


def test_one_prompt_streams_the_greedy_completion(
    checkpoint: tuple[Path, GPT, Tokenizer], capsys: pytest.CaptureFixture[str]
) -> None:
    path, model, tokenizer = checkpoint
    args = ["generate", str(path), "the fox", "--max-new-tokens", "12", "--temperature", "0"]
    assert main(args) == 0
    captured = capsys.readouterr()
    expected = generate_text(model, tokenizer, ["the fox"], max_new_tokens=12, temperature=0)[0]
    assert len(expected) == 12
    assert captured.out == "the fox" + expected + "\n"
    assert "12 new tokens in" in captured.err
    # flags between CHECKPOINT and the prompt, as `inspect` and `lens` take them
    assert main(["generate", str(path), "--max-new-tokens", "12", "--temperature", "0",
                 "the fox"]) == 0
    assert capsys.readouterr().out == captured.out
    with pytest.raises(SystemExit):
        main(["generate", str(path), "--temperature", "0", "the fox", "extra"])
    assert "after PROMPT 'the fox'; a PROMPT of several words goes in quotes" in (
        capsys.readouterr().err)


def test_text_reaches_stdout_before_generation_ends(
    checkpoint: tuple[Path, GPT, Tokenizer],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path, _, _ = checkpoint
    seen: list[str] = []

    class Scripted:  # stream_text's pieces, and the tokens made (TextPieces.made)
        def __init__(self) -> None:
            self.made = [3]

        def __iter__(self) -> Iterator[list[str]]:
            for piece in ["a", "b", "c"]:
                yield [piece]
                seen.append(capsys.readouterr().out)  # what the terminal shows after this

    monkeypatch.setattr(generate_mod, "stream_text", lambda *args, **kwargs: Scripted())
    assert main(["generate", str(path), "go ", "--max-new-tokens", "3"]) == 0
    assert seen == ["go a", "b", "c"]


def test_ctrl_c_ends_the_streamed_line(
    checkpoint: tuple[Path, GPT, Tokenizer], capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The shell's prompt after an interrupted generation starts a line of its own."""
    path, _, _ = checkpoint

    def interrupted(*args: Any, **kwargs: Any) -> Iterator[list[str]]:
        yield ["a"]
        raise KeyboardInterrupt

    monkeypatch.setattr(generate_mod, "stream_text", interrupted)
    assert main(["generate", str(path), "go ", "--max-new-tokens", "3"]) == 130
    captured = capsys.readouterr()
    assert captured.out == "go a\n" and "interrupted" in captured.err


def test_prompt_file_runs_batches_and_prints_each_completion(
    checkpoint: tuple[Path, GPT, Tokenizer], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, model, tokenizer = checkpoint
    prompts = ["the", "a lazy dog", "quick brown fox jumps"]
    (tmp_path / "prompts.txt").write_text("\n".join(prompts[:2]) + "\n\n" + prompts[2] + "\n")
    args = ["generate", str(path), "--prompt-file", str(tmp_path / "prompts.txt"),
            "--max-new-tokens", "8", "--temperature", "0", "--batch-size", "2"]
    assert main(args) == 0
    out = capsys.readouterr().out
    blocks = out.split("=== prompt ")[1:]
    assert [b.split("\n", 1)[0] for b in blocks] == ["1/3", "2/3", "3/3"]
    for prompt, block in zip(prompts, blocks, strict=True):
        alone = generate_text(model, tokenizer, [prompt], max_new_tokens=8, temperature=0)[0]
        assert block.split("\n", 1)[1] == prompt + alone + "\n"


def test_a_prompt_file_counts_each_rows_tokens_and_checks_every_prompt_first(
    checkpoint: tuple[Path, GPT, Tokenizer], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The new tokens of a batch are each row's own (a row ended by a stop string makes no
    more), as each prompt run alone counts them; a prompt too long for the context is named
    before any batch runs; --seed outside what seeds take is refused."""
    path, model, tokenizer = checkpoint
    full = generate_text(model, tokenizer, ["the"], max_new_tokens=20, temperature=0)[0]
    flags = ["--max-new-tokens", "20", "--temperature", "0", "--stop", full[6:8]]
    prompts = ["the", "quick"]
    made = []
    for prompt in prompts:
        assert main(["generate", str(path), prompt, *flags]) == 0
        made.append(int(capsys.readouterr().err.split("[")[1].split(" new token")[0]))
    assert made[0] < 20 and made[0] != made[1]  # the stop string ended one row early
    (tmp_path / "prompts.txt").write_text("\n".join(prompts) + "\n")
    assert main(["generate", str(path), "--prompt-file", str(tmp_path / "prompts.txt"),
                 *flags]) == 0
    assert f"[{sum(made)} new tokens in " in capsys.readouterr().err
    (tmp_path / "long.txt").write_text("the\n" + "a" * 40 + "\nthe\n")  # block_size 32
    assert main(["generate", str(path), "--prompt-file", str(tmp_path / "long.txt"),
                 "--batch-size", "1", "--max-new-tokens", "4"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""  # refused before the first batch ran
    assert "prompt 2/3 has 40 tokens; with 4 new tokens it runs past the model's context " \
        "(block_size=32); lower --max-new-tokens, shorten it, or pass --sliding-window" \
        in captured.err
    for seed in ("-1", str(2**64)):
        assert main(["generate", str(path), "the", "--seed", seed]) == 1
        assert f"--seed {seed} is out of range; use 0 to 2**64 - 1" in capsys.readouterr().err


def test_sampling_flags_are_seeded(
    checkpoint: tuple[Path, GPT, Tokenizer], capsys: pytest.CaptureFixture[str]
) -> None:
    path, _, _ = checkpoint
    flags = ["--max-new-tokens", "20", "--temperature", "1.3", "--top-k", "10", "--top-p", "0.9"]
    outs = []
    for seed in ("1", "1", "2"):
        assert main(["generate", str(path), "the", *flags, "--seed", seed]) == 0
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1] != outs[2]


def test_one_seed_gives_one_sequence_of_draws_over_a_prompt_file(
    checkpoint: tuple[Path, GPT, Tokenizer], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # each batch used to re-seed: a prompt repeated four times gave four identical
    # completions at --batch-size 1 and four different ones at 16
    path, _, _ = checkpoint
    (tmp_path / "prompts.txt").write_text("the\n" * 4)
    flags = ["--prompt-file", str(tmp_path / "prompts.txt"), "--max-new-tokens", "16",
             "--temperature", "1.3", "--seed", "3"]
    runs = {}
    for batch_size in ("1", "3", "16"):
        assert main(["generate", str(path), *flags, "--batch-size", batch_size]) == 0
        runs[batch_size] = capsys.readouterr().out.split("=== prompt ")[1:]
    assert runs["1"] == runs["3"] == runs["16"]
    assert len(set(runs["1"])) == 4, runs["1"]  # a repeated prompt gets fresh draws
    # the file's first prompt draws what the same prompt given alone draws
    assert main(["generate", str(path), "the", *flags[2:]]) == 0
    assert runs["1"][0].split("\n", 1)[1] == capsys.readouterr().out


def test_stop_string_ends_the_completion(
    checkpoint: tuple[Path, GPT, Tokenizer], capsys: pytest.CaptureFixture[str]
) -> None:
    path, model, tokenizer = checkpoint
    full = generate_text(model, tokenizer, ["the"], max_new_tokens=20, temperature=0)[0]
    stop = full[5:7]
    assert main(["generate", str(path), "the", "--max-new-tokens", "20", "--temperature",
                 "0", "--stop", stop]) == 0
    assert capsys.readouterr().out == "the" + full[:full.index(stop)] + "\n"


def test_errors_name_the_problem(
    checkpoint: tuple[Path, GPT, Tokenizer], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, _, _ = checkpoint
    assert main(["generate", str(tmp_path / "missing"), "the"]) == 1
    assert "missing does not exist" in capsys.readouterr().err
    # a file of the checkpoint, not its directory: it exists, so say what to pass instead
    assert main(["info", str(path / "model.safetensors")]) == 1
    assert (f"model.safetensors is a file; a checkpoint is the directory that holds it: "
            f"pass {path}") in capsys.readouterr().err

    long_prompt = "the lazy dog jumps over the fox"  # 31 characters, block_size 32
    assert main(["generate", str(path), long_prompt, "--max-new-tokens", "5"]) == 1
    err = capsys.readouterr().err
    assert "runs past the model's context (block_size=32)" in err and "--sliding-window" in err
    args = ["generate", str(path), long_prompt, "--max-new-tokens", "5", "--sliding-window"]
    assert main(args) == 0
    assert capsys.readouterr().out.startswith(long_prompt)

    assert main(["generate", str(path), "the", "--prompt-file", str(tmp_path / "p.txt")]) == 1
    assert "not both" in capsys.readouterr().err
    assert main(["generate", str(path), "--prompt-file", str(tmp_path / "p.txt")]) == 1
    assert "p.txt does not exist" in capsys.readouterr().err
    assert main(["generate", str(path), "THE"]) == 1  # not in the char vocabulary
    assert "cannot encode" in capsys.readouterr().err
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("the\n\nTHE fox\n")  # the second prompt (third line) cannot be read
    assert main(["generate", str(path), "--prompt-file", str(prompts)]) == 1
    assert "prompt 2/2: char tokenizer cannot encode character 'T'" in capsys.readouterr().err
    assert main(["generate", str(path), "the", "--stop", ""]) == 1
    assert "an empty stop string matches nothing" in capsys.readouterr().err
    assert main(["generate", str(path), "the", "--batch-size", "4"]) == 1  # had no effect
    assert "groups the prompts of --prompt-file" in capsys.readouterr().err


def test_hugging_face_directory_generates_the_same_text(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("tokenizers")
    from attnlab.hf import save_hf_gpt2

    tokenizer = get_tokenizer("bpe:300", TEXT * 20)
    model = _model_and_tokenizer(tokenizer)
    save_checkpoint(tmp_path / "ours", model, tokenizer)
    save_hf_gpt2(tmp_path / "hf", model, tokenizer)
    outs = []
    for directory in ("ours", "hf"):
        args = ["generate", str(tmp_path / directory), "the quick", "--max-new-tokens", "10",
                "--temperature", "0"]
        assert main(args) == 0
        outs.append(capsys.readouterr().out)
    expected = generate_text(model, tokenizer, ["the quick"], max_new_tokens=10, temperature=0)
    assert outs == ["the quick" + expected[0] + "\n"] * 2


def test_dtype_bfloat16_generates_what_a_bfloat16_model_does(
    checkpoint: tuple[Path, GPT, Tokenizer], capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path, model, tokenizer = checkpoint
    args = ["generate", str(path), "the fox", "--max-new-tokens", "8", "--temperature", "0",
            "--dtype", "bfloat16"]
    monkeypatch.setattr(runtime, "fast_bf16", lambda: True)  # no warning: see the next test
    assert main(args) == 0
    model16 = model.to(torch.bfloat16)
    expected = generate_text(model16, tokenizer, ["the fox"], max_new_tokens=8, temperature=0)[0]
    assert capsys.readouterr().out == "the fox" + expected + "\n"
    monkeypatch.setattr(runtime, "fast_bf16", lambda: False)
    with pytest.warns(runtime.SlowBF16Warning, match="runs several times slower"):
        assert main(args) == 0


def test_a_cpu_without_bfloat16_units_is_named_in_one_line(
    checkpoint: tuple[Path, GPT, Tokenizer],
) -> None:
    """Emulated bfloat16 ran 8x slower than float32 here, silently; the CLI now says so as
    it says errors: one line, no file:line or warning class."""
    script = ("import sys; from attnlab.model import runtime; from attnlab.cli import main; "
              "runtime.fast_bf16 = lambda: False; sys.exit(main(sys.argv[1:]))")
    run = subprocess.run([sys.executable, "-c", script, "generate", str(checkpoint[0]), "the",
                          "--max-new-tokens", "2", "--dtype", "bfloat16"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stderr.startswith("attnlab generate: warning: this CPU has no bfloat16 units "
                                 "(AVX512-BF16 or AMX), so bfloat16 is emulated"), run.stderr
    assert "Warning" not in run.stderr and ".py" not in run.stderr


@pytest.mark.skipif("fbgemm" not in torch.backends.quantized.supported_engines,
                    reason="float16 weights need fbgemm (x86 CPUs)")
def test_float16_weights_generate_what_the_rounded_model_does(
    checkpoint: tuple[Path, GPT, Tokenizer], capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import attnlab.model.decode as decode_mod

    path, model, tokenizer = checkpoint
    real, halved = decode_mod.half_weights, []

    def spy(m: GPT, progress: Any = None) -> GPT:  # the model the command generates with
        halved.append(real(m, progress))
        return m

    monkeypatch.setattr(decode_mod, "half_weights", spy)
    args = ["generate", str(path), "the fox", "--max-new-tokens", "8", "--temperature", "0",
            "--weights", "float16"]
    assert main(args) == 0
    assert len(halved) == 1 and halved[0].decode_weights == "float16"
    rounded = real(copy.deepcopy(model))
    expected = generate_text(rounded, tokenizer, ["the fox"], max_new_tokens=8, temperature=0)
    captured = capsys.readouterr()
    assert captured.out == "the fox" + expected[0] + "\n"
    assert "[float16 weights packed in " in captured.err
    assert main([*args, "--dtype", "bfloat16"]) == 1
    assert "--weights float16 computes in float32; drop --dtype bfloat16" in (
        capsys.readouterr().err)


def test_a_too_long_request_fails_before_the_prompt_is_echoed(
    checkpoint: tuple[Path, GPT, Tokenizer], capsys: pytest.CaptureFixture[str]
) -> None:
    path, _, _ = checkpoint  # block_size 32
    assert main(["generate", str(path), "the fox", "--max-new-tokens", "40"]) != 0
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "runs past the model's context (block_size=32)" in captured.err
    assert "--sliding-window" in captured.err


@pytest.mark.parametrize("command", ["generate", "train", "load_checkpoint", "load_hf"])
def test_a_missing_cuda_is_named_not_a_corrupted_file(
    command: str, checkpoint: tuple[Path, GPT, Tokenizer], tmp_path: Path,
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    # generate --device cuda without CUDA said the weights file was corrupted (pin_memory)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    path, _, _ = checkpoint
    if command == "load_checkpoint":
        from attnlab.load import load_checkpoint

        with pytest.raises(ValueError, match="CUDA is not available") as exc:
            load_checkpoint(path, map_location="cuda")
        assert "corrupted" not in str(exc.value)
        return
    if command == "load_hf":  # torch's own "not compiled with CUDA" assertion before
        from attnlab import load_hf, save_hf
        save_hf(tmp_path / "hf", checkpoint[1])
        with pytest.raises(ValueError, match="CUDA is not available here; use 'cpu'"):
            load_hf(tmp_path / "hf", map_location="cuda")
        return
    argv = {"generate": ["generate", str(path), "the", "--device", "cuda"],
            "train": ["train", "--device", "cuda", "--out", str(tmp_path / "run")]}[command]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "device='cuda' but CUDA is not available here; use 'cpu' (--device cpu)" in err, err
    assert "corrupted" not in err and err.count("\n") == 1
    assert not (tmp_path / "run").exists()
    if command == "generate":  # a device torch does not know lists the ones it does
        assert main(["generate", str(path), "the", "--device", "tpu"]) == 1
        assert "use auto, cpu, cuda, cuda:N or mps" in capsys.readouterr().err


@pytest.mark.parametrize("content", [b"\x89PNG\r\n\x1a\n\x00\x00", b"the\x00fox\n"])
def test_a_binary_prompt_file_gets_one_clear_line(
    content: bytes, checkpoint: tuple[Path, GPT, Tokenizer], tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # a PNG as --prompt-file printed the raw codec error ("'utf-8' codec can't decode ...")
    path, _, _ = checkpoint
    (tmp_path / "prompts.txt").write_bytes(content)
    assert main(["generate", str(path), "--prompt-file", str(tmp_path / "prompts.txt")]) == 1
    err = capsys.readouterr().err
    assert "codec" not in err and err.count("\n") == 1
    assert "is not UTF-8 text (byte 0x89 at offset 0)" in err or "holds NUL bytes" in err


def test_counts_of_one_are_singular(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # "1 layers, 1 heads" (seed 002's one-layer, one-head model), "[1 new tokens in ...]"
    tokenizer = get_tokenizer("char", TEXT)
    torch.manual_seed(0)
    config = GPTConfig(n_layer=1, n_head=1, n_embd=8, vocab_size=tokenizer.vocab_size,
                       block_size=16)
    path = save_checkpoint(tmp_path / "ckpt", GPT(config).eval(), tokenizer)
    assert main(["info", str(path)]) == 0
    assert "model       1 layer, 1 head, 8 dims" in capsys.readouterr().out
    assert main(["generate", str(path), "the", "--max-new-tokens", "1"]) == 0
    assert "[1 new token in " in capsys.readouterr().err
    assert main(["inspect", str(path), "t", "--out", str(tmp_path / "fig")]) == 0
    assert "text     1 token: 't'" in capsys.readouterr().out


@pytest.fixture
def hf_dir(tmp_path: Path) -> Path:
    pytest.importorskip("tokenizers")
    from attnlab.hf import save_hf_gpt2

    tokenizer = get_tokenizer("bpe:300", TEXT * 20)
    return save_hf_gpt2(tmp_path / "hf", _model_and_tokenizer(tokenizer), tokenizer)


def test_a_model_directorys_generation_config_sets_the_sampling_flags_not_given(
    hf_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """As transformers' generate() reads generation_config.json: do_sample false is greedy,
    do_sample true samples with its temperature, top_k and top_p (transformers' defaults
    where it leaves one out: 1.0, 50, 1.0); a flag given wins; without do_sample, attnlab's
    own default (temperature 0.8)."""
    def run(*flags: str, config: dict[str, Any] | None = None) -> tuple[str, str]:
        (hf_dir / "generation_config.json").write_text(json.dumps(config or {}))
        assert main(["generate", str(hf_dir), "the", "--max-new-tokens", "12", "--seed", "3",
                     *flags]) == 0
        captured = capsys.readouterr()
        return captured.out, captured.err

    greedy, _ = run("--temperature", "0")
    out, err = run(config={"do_sample": False, "temperature": 0.6})
    assert out == greedy and "[sampling: greedy, from generation_config.json" in err
    sampled, _ = run("--temperature", "1.3", "--top-k", "50", "--top-p", "0.9", "--min-p",
                     "0.05", "--repetition-penalty", "1.1")
    assert sampled != greedy
    out, err = run(config={"do_sample": True, "temperature": 1.3, "top_p": 0.9,
                           "min_p": 0.05, "repetition_penalty": 1.1})
    assert out == sampled
    assert ("temperature 1.3, top_k 50, top_p 0.9, min_p 0.05, typical_p 1.0, "
            "repetition_penalty 1.1, from generation_config.json") in err
    assert run("--temperature", "1.3", config={"do_sample": False})[0] == run(
        "--temperature", "1.3")[0] != greedy  # the flag wins over do_sample false
    assert run(config={"temperature": 0.1})[0] == run("--temperature", "0.8")[0]
    out, err = run("--top-p", "0.5", config={"do_sample": False})
    assert out == greedy and ("temperature 0 is greedy: --top-k, --top-p, --min-p and "
                              "--typical-p do") in err
    (hf_dir / "generation_config.json").write_text(json.dumps({"do_sample": True,
                                                               "top_p": 1.5}))
    assert main(["generate", str(hf_dir), "the", "--max-new-tokens", "2"]) == 1
    assert "generation_config.json's top_p 1.5 must be in" in capsys.readouterr().err


def test_repetition_penalty_and_min_p_flags_reach_generation(
    checkpoint: tuple[Path, GPT, Tokenizer], capsys: pytest.CaptureFixture[str]
) -> None:
    """--repetition-penalty (greedy too) and --min-p, in either spelling, generate what
    generate_text does with them; out-of-range values are named by their flag."""
    path, model, tokenizer = checkpoint

    run, expected = generate_flag_runs(path, model, tokenizer, capsys, 20)

    greedy = run("--temperature", "0")
    penalized = run("--temperature", "0", "--repetition-penalty", "3")
    assert penalized == expected(temperature=0, repetition_penalty=3.0) != greedy
    assert run("--temperature", "0", "--repetition_penalty", "3") == penalized
    narrowed = run("--temperature", "2", "--min_p", "0.5", "--seed", "4")
    assert narrowed == expected(temperature=2.0, min_p=0.5, seed=4)
    assert narrowed != run("--temperature", "2", "--seed", "4")
    for flags, message in ((["--min-p", "1.5"], "--min-p 1.5 must be in [0, 1]"),
                           (["--repetition-penalty", "0"],
                            "--repetition-penalty 0.0 must be finite and > 0")):
        assert main(["generate", str(path), "the", *flags]) == 1
        assert message in capsys.readouterr().err


def test_generation_config_repetition_penalty_applies_to_greedy_and_without_do_sample(
    hf_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """transformers applies a generation_config.json's repetition_penalty whether it samples
    or not: so does attnlab, where --repetition-penalty is left out."""
    def run(*flags: str, config: dict[str, Any] | None = None) -> tuple[str, str]:
        (hf_dir / "generation_config.json").write_text(json.dumps(config or {}))
        assert main(["generate", str(hf_dir), "the", "--max-new-tokens", "16", "--seed", "3",
                     *flags]) == 0
        captured = capsys.readouterr()
        return captured.out, captured.err

    greedy, _ = run("--temperature", "0")
    penalized, _ = run("--temperature", "0", "--repetition-penalty", "3")
    assert penalized != greedy
    out, err = run(config={"do_sample": False, "repetition_penalty": 3.0})
    assert out == penalized
    assert "[sampling: greedy, repetition_penalty 3.0, from generation_config.json" in err
    out, err = run("--temperature", "0", config={"repetition_penalty": 3.0})
    assert out == penalized and "[sampling: repetition_penalty 3.0, from" in err
    assert run("--repetition-penalty", "1", config={"do_sample": False,
                                                      "repetition_penalty": 3.0})[0] == greedy
    out, err = run(config={"do_sample": True, "min_p": None, "repetition_penalty": None})
    assert "min_p 0.0, typical_p 1.0, repetition_penalty 1.0, from" in err  # null: left out
