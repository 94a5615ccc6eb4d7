"""The CLI's device check and token limit at their edges (mutation testing,
round 3)."""

from __future__ import annotations

import pytest
import torch

from attnlab.cli.common import CLIError, check_device, text_ids
from attnlab.tokenizers import get_tokenizer


def test_the_first_index_past_the_gpus_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert check_device("cuda:1") == torch.device("cuda:1")
    with pytest.raises(ValueError, match=r"device='cuda:2' but this machine has 2 CUDA devices "
                                         r"\(cuda:0, cuda:1\)"):
        check_device("cuda:2")


def test_a_text_of_exactly_block_size_tokens_is_read() -> None:
    tok = get_tokenizer("char", "ab")
    assert text_ids(tok, "ab" * 4, 8) == tok.encode("ab" * 4)
    with pytest.raises(CLIError, match=r"the text is 9 tokens, the model reads at most "
                                       r"block_size=8"):
        text_ids(tok, "ab" * 4 + "a", 8)


@pytest.fixture
def checkpoint(tmp_path):
    from attnlab import GPT, GPTConfig
    from attnlab.checkpoint import save_checkpoint

    tok = get_tokenizer("char", "the quick brown fox\n")
    torch.manual_seed(0)
    model = GPT(GPTConfig.from_name("nano", vocab_size=tok.vocab_size, block_size=32)).eval()
    return save_checkpoint(tmp_path / "ckpt", model, tok)


def test_the_default_length_fills_the_context(checkpoint, capsys: pytest.CaptureFixture[str]
                                              ) -> None:
    """A 30-token prompt in a 32-token context: 3 new tokens (the last is never fed back)."""
    from attnlab.cli import main

    assert main(["generate", str(checkpoint), "the quick brown fox the quick ",
                 "--temperature", "0", "--device", "cpu"]) == 0
    assert capsys.readouterr().err.startswith("[3 new tokens in ")


@pytest.mark.parametrize(("flags", "message"), [
    (["--threads", "0"], "--threads 0 must be >= 1"),
    (["--prompt-file", "PROMPTS", "--batch-size", "0"], "--batch-size 0 must be >= 1"),
    (["--system", "be brief"], "--system goes with --chat"),
    # GenerationConfig's checks, named by the flag (they said max_new_tokens=0, top_k=-1)
    (["--max-new-tokens", "0"], "--max-new-tokens 0 must be a positive integer"),
    (["--top-k", "-1"], "--top-k -1 must be an integer >= 0"),
    (["--temperature", "-1"], "--temperature -1.0 must be finite and >= 0"),
])
def test_flags_that_cannot_work_are_refused_before_loading(
        checkpoint, tmp_path, capsys: pytest.CaptureFixture[str], monkeypatch, flags, message
) -> None:
    from attnlab.cli import generate as generate_cli
    from attnlab.cli import main

    monkeypatch.setattr(generate_cli, "load_opened", lambda *args: pytest.fail("loaded"))
    (tmp_path / "p.txt").write_text("the\n")
    flags = [str(tmp_path / "p.txt") if f == "PROMPTS" else f for f in flags]
    prompt = [] if "--prompt-file" in flags else ["the"]
    assert main(["generate", str(checkpoint), *prompt, *flags]) == 1
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


@pytest.mark.parametrize("command", [["generate", "CKPT", "abc"], ["bench", "attention"],
                                     ["serve", "CKPT"]])
def test_threads_is_one_flag_with_one_check_and_a_default(
        command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    from attnlab.cli import build_parser, main

    assert main([*command, "--threads", "0"]) == 1
    assert capsys.readouterr().err == (f"attnlab {command[0]}: error: --threads 0 must be >= 1; "
                                       "leave it out for torch's choice\n")
    _, parsers = build_parser([command[0]])
    threads = next(a for a in parsers[command[0]]._actions if a.dest == "threads")
    assert "(default: torch's choice, one per physical core" in str(threads.help)


def test_an_empty_prompt_says_to_give_one(checkpoint, capsys: pytest.CaptureFixture[str]
                                          ) -> None:
    """It said "prompts[0] is empty", the library's name for it."""
    from attnlab.cli import main

    for prompt in ([""], []):
        assert main(["generate", str(checkpoint), *prompt, "--device", "cpu"]) == 1
        assert capsys.readouterr().err == (
            "attnlab generate: error: PROMPT is empty, and tokenizer 'char' has no begin- or "
            f"end-of-text token to start from; give a prompt: attnlab generate {checkpoint} "
            "'some text'\n")


def test_a_quoted_tilde_is_the_home_directory(checkpoint, tmp_path, monkeypatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """A shell leaves "~/runs/copy" quoted, and --out=~/x, as written."""
    from attnlab.cli import main

    monkeypatch.setenv("HOME", str(checkpoint.parent))
    assert main(["generate", f"~/{checkpoint.name}", "the", "--max-new-tokens", "2",
                 "--device", "cpu"]) == 0
    assert capsys.readouterr().out.startswith("the")


def test_threads_are_cut_to_the_cores_other_work_leaves_idle(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """train and generate without --threads: torch's threads scaled to the idle share of the
    cores, said in a line on a terminal's stderr; --threads, or bench, leaves them."""
    import argparse

    from attnlab.cli import common
    from attnlab.model import runtime

    assert [runtime.shared_threads(2, busy, 2) for busy in (0.0, 0.4, 1.0, 2.0, 2.5)] == [
        2, 2, 1, 1, 1]
    assert runtime.shared_threads(8, 3.0, 16) == 6 and runtime.shared_threads(1, 0.0, 2) == 1
    busy = runtime.busy_cores(0.05)
    assert busy is None or 0.0 <= busy <= (common.os.cpu_count() or 1)
    before = torch.get_num_threads()
    monkeypatch.setattr(common.os, "cpu_count", lambda: 4)
    monkeypatch.setattr(runtime, "busy_cores", lambda interval=0.1: 3.0)
    try:
        torch.set_num_threads(4)
        common.apply_threads(argparse.Namespace(threads=None))  # bench's: torch's choice
        assert torch.get_num_threads() == 4 and capsys.readouterr().err == ""
        common.apply_threads(argparse.Namespace(threads=3), share=True)
        assert torch.get_num_threads() == 3
        torch.set_num_threads(4)
        common.apply_threads(argparse.Namespace(threads=None), share=True)
        assert torch.get_num_threads() == 1 and capsys.readouterr().err == ""  # not a terminal
        torch.set_num_threads(4)
        monkeypatch.setattr(common.sys.stderr, "isatty", lambda: True)
        common.apply_threads(argparse.Namespace(threads=None), share=True)
        assert torch.get_num_threads() == 1
        assert capsys.readouterr().err == (
            "note: other work keeps 3.0 of this machine's 4 cores busy, so torch runs 1 "
            "thread, not 4 (threads that share a core wait on each other); --threads N "
            "chooses\n")
    finally:
        torch.set_num_threads(before)


def test_info_says_what_the_kv_cache_adds_a_token(checkpoint, capsys: pytest.CaptureFixture[str]
                                                  ) -> None:
    """k and v of each key/value head, every layer, in bfloat16: Llama-3.1-70B's shape holds
    327.7 kB a token, 42.9 GB over its 131,072 positions (docs/models.md's example)."""
    from attnlab.cli import main
    from attnlab.generate.memory import cache_numbers
    from attnlab.model.config import GPTConfig

    seventy = GPTConfig(n_layer=80, n_head=64, n_kv_head=8, n_embd=8192, block_size=131072,
                        pos="rope", norm="rmsnorm", mlp="swiglu", bias=False)
    assert 2 * cache_numbers(seventy) == 327_680
    assert main(["info", str(checkpoint)]) == 0
    assert "kv cache    128 bytes a token in bfloat16 (2 layers of k and v, 2 heads x 8), " \
        "4.1 kB for the whole context (32)\n" in capsys.readouterr().out
