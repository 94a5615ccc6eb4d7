"""hf/chat.py and `generate --chat`: a directory's chat template renders and encodes as
transformers' apply_chat_template does (one BOS), survives an attnlab checkpoint, and the
CLI sends prompts through it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attnlab.checkpoint import save_checkpoint
from attnlab.cli import main
from attnlab.generate import generate_text
from attnlab.hf import load_hf_tokenizer
from attnlab.load import load_checkpoint

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

WORDS = ["<s>", "</s>", "<|im_start|>", "<|im_end|>", "<pad>", "system", "user", "assistant",
         "you", "are", "kind", "what", "is", "a", "cat", "?", "\n"]
CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + "
          "'<|im_end|>' + '\\n' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
# Llama 3 style: the template writes the BOS itself; the tokenizer also adds one
WITH_BOS = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' and not "
            "loop.first %}{{ raise_exception('system first') }}{% endif %}"
            "{{ m['role'] + ' ' + m['content'] + ' ' + eos_token + ' ' }}{% endfor %}"
            "{% if add_generation_prompt %}{{ 'assistant ' }}{% endif %}")
MESSAGES = [{"role": "system", "content": "you are kind"},
            {"role": "user", "content": "what is a cat ?"}]


def write_dir(directory: Path, template: str, add_bos: bool) -> None:
    tk = tokenizers
    backend = tk.Tokenizer(tk.models.WordLevel({w: i for i, w in enumerate(WORDS)},
                                               unk_token="<pad>"))
    backend.pre_tokenizer = tk.pre_tokenizers.Split(tk.Regex(r"\s+|\n"), "removed")
    backend.add_special_tokens(WORDS[:5])
    directory.mkdir(parents=True, exist_ok=True)
    backend.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>",
        "add_bos_token": add_bos, "chat_template": template,
        "tokenizer_class": "PreTrainedTokenizerFast"}))


def hf_ids(directory: Path) -> list[int]:
    hf = transformers.AutoTokenizer.from_pretrained(directory)
    out = hf.apply_chat_template(MESSAGES, tokenize=True, add_generation_prompt=True)
    return list(out["input_ids"] if isinstance(out, dict) or hasattr(out, "keys") else out)


@pytest.mark.parametrize("template, add_bos", [(CHATML, False), (WITH_BOS, True)])
def test_chat_prompt_renders_and_encodes_as_transformers_does(
    tmp_path: Path, template: str, add_bos: bool
) -> None:
    write_dir(tmp_path, template, add_bos)
    tok = load_hf_tokenizer(tmp_path)
    hf = transformers.AutoTokenizer.from_pretrained(tmp_path)
    text = hf.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    ours = tok.chat_prompt(MESSAGES)
    assert ours == text
    ids = tok.encode(ours)
    assert ids == hf_ids(tmp_path)
    assert ids.count(0) == (1 if add_bos else 0)  # one BOS, not two
    if template is WITH_BOS:  # raise_exception, as transformers defines it
        with pytest.raises(ValueError, match="the chat template refused these messages: "
                                             "system first"):
            tok.chat_prompt([MESSAGES[1], MESSAGES[0]])


def metaspace_dir(directory: Path, template: str) -> None:
    """Mistral v0.3's / TinyLlama-converted shape: Metaspace with prepend_scheme="first" (a "▁"
    before the text's first word only, and none after a special token), add_bos_token."""
    tk = tokenizers
    body = ["system", "user", "assistant", "you", "are", "kind", "what", "is", "a", "cat", "?"]
    words = [*WORDS[:5], *body, *("▁" + w for w in body), "▁", "\n"]
    backend = tk.Tokenizer(tk.models.WordLevel({w: i for i, w in enumerate(words)},
                                               unk_token="<pad>"))
    backend.pre_tokenizer = tk.pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    backend.decoder = tk.decoders.Metaspace(replacement="▁", prepend_scheme="first")
    backend.add_special_tokens(words[:5])
    backend.post_processor = tk.processors.TemplateProcessing(single="<s> $A",
                                                              special_tokens=[("<s>", 0)])
    directory.mkdir(parents=True, exist_ok=True)
    backend.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<s>", "eos_token": "</s>", "add_bos_token": True,
        "chat_template": template, "tokenizer_class": "PreTrainedTokenizerFast"}))


@pytest.mark.parametrize("template", [WITH_BOS, CHATML])
def test_chat_ids_are_transformers_for_a_tokenizer_that_adds_a_bos(
    tmp_path: Path, template: str
) -> None:
    """apply_chat_template encodes without special tokens: a template that writes no BOS gets
    none (attnlab added one), and the word after the BOS a template writes gets no "▁"
    (attnlab cut the "<s>" text off and encoded "system" as the text's start, "▁system")."""
    metaspace_dir(tmp_path, template)
    tok = load_hf_tokenizer(tmp_path)
    ids = tok.encode(tok.chat_prompt(MESSAGES))
    assert ids == hf_ids(tmp_path)
    assert ids.count(0) == (1 if template is WITH_BOS else 0)
    assert tok.encode("you are")[:1] == [0]  # plain text still gets its BOS


def test_generate_chat_sends_the_prompt_through_the_template(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=len(WORDS), hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        bos_token_id=0, eos_token_id=3, pad_token_id=4, initializer_range=0.2)
    transformers.LlamaForCausalLM(config).eval().save_pretrained(tmp_path / "hf")
    write_dir(tmp_path / "hf", CHATML, add_bos=False)
    ckpt = load_checkpoint(tmp_path / "hf")
    args = ["generate", str(tmp_path / "hf"), "what is a cat ?", "--chat", "--system",
            "you are kind", "--max-new-tokens", "5", "--temperature", "0"]
    assert main(args) == 0
    answer = generate_text(ckpt.model, ckpt.tokenizer, [ckpt.tokenizer.chat_prompt(MESSAGES)],
                           max_new_tokens=5, temperature=0)[0]
    assert capsys.readouterr().out == "what is a cat ?\n" + answer + "\n"

    save_checkpoint(tmp_path / "ckpt", ckpt.model, ckpt.tokenizer)  # the template is kept
    assert load_checkpoint(tmp_path / "ckpt").tokenizer.chat_prompt(MESSAGES) == \
        ckpt.tokenizer.chat_prompt(MESSAGES)

    (tmp_path / "hf" / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>"}))
    assert main([*args[:3], "--chat"]) == 1
    assert "tokenizer has no chat template" in capsys.readouterr().err
    assert main([*args[:3], "--system", "hi"]) == 1
    assert "--system goes with --chat" in capsys.readouterr().err
    write_dir(tmp_path / "hf", "{{ unk_token + m }}", add_bos=False)  # one line, no traceback
    assert main(args) == 1
    assert capsys.readouterr().err == (
        "attnlab generate: error: --chat: the chat template failed on these messages "
        "(UndefinedError: 'unk_token' is undefined); a special token it names may be missing "
        "from tokenizer_config.json (it defines ['bos_token', 'eos_token', 'pad_token']), or "
        "the template is broken: fix 'chat_template' there or chat_template.jinja\n")


def test_a_template_renders_in_a_process_that_imported_nothing_else() -> None:
    """`import jinja2` leaves out jinja2.ext, which the sandbox's extension list names: in the
    test session transformers had imported it, and `attnlab generate --chat` in a fresh
    process failed with "module 'jinja2' has no attribute 'ext'"."""
    code = ("from attnlab.tokenizers.chat import render_chat; "
            "print(render_chat(\"{% for m in messages %}{{ m['content'] }}{% break %}"
            "{% endfor %}\", [{'role': 'user', 'content': 'hi'}, "
            "{'role': 'user', 'content': 'no'}]))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert (done.returncode, done.stdout, done.stderr) == (0, "hi\n", "")


@pytest.mark.parametrize("template, error", [
    ("{{ unk_token + m }}", "UndefinedError: 'unk_token' is undefined"),
    ("{{ messages[0]['content'] + 1 }}", 'TypeError: can only concatenate str (not "int") to str'),
])
def test_a_template_that_fails_on_the_messages_is_one_line(
    tmp_path: Path, template: str, error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Raised while rendering (a Llama 2 template naming bos_token in a Qwen directory,
    which has none), jinja2's and Python's errors went out as a traceback."""
    write_dir(tmp_path, template, add_bos=False)
    line = (f"the chat template failed on these messages ({error}); a special token it names "
            "may be missing from tokenizer_config.json (it defines ['bos_token', "
            "'eos_token', 'pad_token']), or the template is broken: fix 'chat_template' "
            "there or chat_template.jinja")
    with pytest.raises(ValueError) as caught:
        load_hf_tokenizer(tmp_path).chat_prompt(MESSAGES)
    assert str(caught.value) == line


# Qwen3's switch: an empty think block unless thinking is on (its own template's logic)
THINKING = CHATML + ("{% if add_generation_prompt and enable_thinking is defined and "
                     "enable_thinking is false %}{{ '<s>\\n\\n</s>\\n\\n' }}{% endif %}")


def test_template_variables_render_as_apply_chat_template_keywords(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_dir(tmp_path, THINKING, add_bos=False)
    hf = transformers.AutoTokenizer.from_pretrained(tmp_path)
    ours = load_hf_tokenizer(tmp_path)
    for variables in ({}, {"enable_thinking": False}, {"enable_thinking": True}):
        text = hf.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True,
                                      **variables)
        assert ours.chat_prompt(MESSAGES, **variables) == text
    assert ours.chat_prompt(MESSAGES, enable_thinking=False).endswith("<s>\n\n</s>\n\n")

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=len(WORDS), hidden_size=32, intermediate_size=48, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        bos_token_id=0, eos_token_id=3, pad_token_id=4)
    transformers.LlamaForCausalLM(config).eval().save_pretrained(tmp_path)
    ckpt = load_checkpoint(tmp_path)
    prompt = ckpt.tokenizer.chat_prompt(MESSAGES[1:], enable_thinking=False)
    answer = generate_text(ckpt.model, ckpt.tokenizer, [prompt], max_new_tokens=4,
                           temperature=0)[0]
    args = ["generate", str(tmp_path), "what is a cat ?", "--chat", "--max-new-tokens", "4",
            "--temperature", "0"]
    assert main([*args, "--chat-var", "enable_thinking=false"]) == 0
    assert capsys.readouterr().out == "what is a cat ?\n" + answer + "\n"
    assert main([*args, "--chat-var", "enable_thinking"]) == 1
    assert "--chat-var 'enable_thinking': give NAME=VALUE" in capsys.readouterr().err
    assert main([*args[:3], "--chat-var", "x=1"]) == 1
    assert "--chat-var goes with --chat" in capsys.readouterr().err
