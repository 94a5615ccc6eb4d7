"""cli/sampling_flags.py: --typical-p and --no-repeat-ngram-size reach generation, are checked
by their flag's name, and are filled from a model directory's generation_config.json as
transformers' generate() reads it (the other sampling flags: tests/cli/test_cli_generate.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from attnlab import GPT, GPTConfig
from attnlab.checkpoint import save_checkpoint
from attnlab.cli import main
from attnlab.tokenizers import Tokenizer, get_tokenizer
from helpers import generate_flag_runs

TEXT = "the quick brown fox jumps over the lazy dog\n"


def _model(tokenizer: Tokenizer) -> GPT:
    torch.manual_seed(0)
    config = GPTConfig.from_name("nano", vocab_size=tokenizer.vocab_size, block_size=48,
                                 init_std=0.3)
    return GPT(config).eval()


def test_typical_p_and_ngram_flags_reach_generation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Fails before: generate had no --typical-p or --no-repeat-ngram-size. Either spelling
    generates what generate_text does with them; out-of-range values are named by flag."""
    tokenizer = get_tokenizer("char", TEXT)
    model = _model(tokenizer)
    path = save_checkpoint(tmp_path / "ckpt", model, tokenizer)

    run, expected = generate_flag_runs(path, model, tokenizer, capsys, 30)

    greedy = run("--temperature", "0")
    banned = run("--temperature", "0", "--no-repeat-ngram-size", "2")
    assert banned == expected(temperature=0, no_repeat_ngram_size=2) != greedy
    assert run("--temperature", "0", "--no_repeat_ngram_size", "2") == banned
    typical = run("--temperature", "1.5", "--typical-p", "0.3", "--seed", "4")
    assert typical == expected(temperature=1.5, typical_p=0.3, seed=4)
    assert typical != run("--temperature", "1.5", "--seed", "4")
    assert run("--temperature", "1.5", "--typical_p", "0.3", "--seed", "4") == typical
    for flags, message in ((["--typical-p", "0"], "--typical-p 0.0 must be in (0, 1]"),
                           (["--typical-p", "1.5"], "--typical-p 1.5 must be in (0, 1]"),
                           (["--no-repeat-ngram-size", "-1"],
                            "--no-repeat-ngram-size -1 must be an integer >= 0")):
        assert main(["generate", str(path), "the", *flags]) == 1
        assert message in capsys.readouterr().err
    assert main(["generate", str(path), "the", "--temperature", "0", "--typical-p", "0.5",
                 "--max-new-tokens", "2"]) == 0
    assert "--min-p and --typical-p do nothing" in capsys.readouterr().err


def test_generation_config_typical_p_samples_and_its_ngram_size_applies_to_greedy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """transformers reads typical_p from generation_config.json when do_sample is true (a
    warper) and no_repeat_ngram_size whatever do_sample says (a processor); so does attnlab,
    for the flags left out."""
    pytest.importorskip("tokenizers")
    from attnlab.hf import save_hf_gpt2

    tokenizer = get_tokenizer("bpe:300", TEXT * 20)
    hf_dir = save_hf_gpt2(tmp_path / "hf", _model(tokenizer), tokenizer)

    def run(*flags: str, config: dict[str, Any] | None = None) -> tuple[str, str]:
        (hf_dir / "generation_config.json").write_text(json.dumps(config or {}))
        assert main(["generate", str(hf_dir), "the", "--max-new-tokens", "24", "--seed", "3",
                     *flags]) == 0
        captured = capsys.readouterr()
        return captured.out, captured.err

    greedy, _ = run("--temperature", "0")
    banned, _ = run("--temperature", "0", "--no-repeat-ngram-size", "1")
    assert banned != greedy
    out, err = run(config={"do_sample": False, "no_repeat_ngram_size": 1})
    assert out == banned
    assert "[sampling: greedy, no_repeat_ngram_size 1, from generation_config.json" in err
    out, err = run("--temperature", "0", config={"no_repeat_ngram_size": 1})
    assert out == banned and "[sampling: no_repeat_ngram_size 1, from" in err
    assert run("--no-repeat-ngram-size", "0", config={
        "do_sample": False, "no_repeat_ngram_size": 1})[0] == greedy  # the flag wins
    typical, _ = run("--temperature", "1.0", "--top-k", "50", "--typical-p", "0.3")
    out, err = run(config={"do_sample": True, "typical_p": 0.3})
    assert out == typical and "min_p 0.0, typical_p 0.3, from" in err
    assert run(config={"do_sample": False, "typical_p": 0.3})[0] == greedy  # a warper: off
    out, err = run(config={"do_sample": True, "typical_p": None, "no_repeat_ngram_size": None})
    assert "typical_p 1.0, no_repeat_ngram_size 0, from" in err  # null: the processor is off
    (hf_dir / "generation_config.json").write_text(json.dumps({"no_repeat_ngram_size": 1.5}))
    assert main(["generate", str(hf_dir), "the", "--max-new-tokens", "2"]) == 1
    assert "generation_config.json's no_repeat_ngram_size 1.5 must be an integer" in \
        capsys.readouterr().err
