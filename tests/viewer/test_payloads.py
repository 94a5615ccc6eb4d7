"""viewer/payloads.py: the texts the viewer starts from fit the model's vocabulary and context; an
attention payload runs the model only as far as the layers it returns, and is written as JSON
a head at a time into json.dumps's very text."""

from __future__ import annotations

import json

import pytest

from attnlab.tokenizers import get_tokenizer
from attnlab.train.data import TaskDataset
from attnlab.viewer.payloads import DEFAULT_TEXT, attention_json, attention_payload, sample_texts
from helpers import make_model


def test_a_task_model_starts_from_its_own_example() -> None:
    tok = TaskDataset("copy").tokenizer
    sample = sample_texts(tok, 16, {"dataset": "copy"})
    assert len(tok.encode(sample["text"])) == 16 and sample["text"].startswith(sample["prompt"])
    assert sample["prompt"].endswith("|") and len(sample["prompt"]) == 9


def test_english_is_kept_where_it_fits_and_cut_to_the_context() -> None:
    tok = get_tokenizer("char", DEFAULT_TEXT)
    assert sample_texts(tok, 256)["text"] == DEFAULT_TEXT
    short = sample_texts(tok, 8)
    assert short == {"text": DEFAULT_TEXT[:8], "prompt": "The cat"}
    assert sample_texts(tok, 4)["prompt"] == "Th"  # leaves room to generate


@pytest.mark.parametrize("block_size", [3, 16])
def test_another_vocabulary_gets_its_own_printable_tokens(block_size: int) -> None:
    tok = get_tokenizer("char", "0123456789+=\n")
    sample = sample_texts(tok, block_size, {"dataset": "numbers.txt"})
    ids = tok.encode(sample["text"])
    assert 0 < len(ids) <= block_size and "\n" not in sample["text"]
    assert 0 < len(tok.encode(sample["prompt"])) < block_size


def test_one_layer_of_attention_runs_the_model_up_to_that_layer() -> None:
    # the viewer asks for one layer at a time: at 512 tokens of GPT-2 small's shape, layer 0
    # took 1.53 s through the whole forward and 0.033 s through Trace.run
    import torch

    from attnlab import GPT, GPTConfig
    from attnlab.viewer.payloads import attention_payload

    tok = get_tokenizer("char", DEFAULT_TEXT)
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=3, n_head=2, n_embd=16, vocab_size=tok.vocab_size,
                          block_size=32)).eval()
    started: list[str] = []
    for name, module in [("block 0", model.blocks[0]), ("block 1", model.blocks[1]),
                         ("block 2", model.blocks[2]), ("head", model.lm_head)]:
        module.register_forward_pre_hook(lambda *_, name=name: started.append(name))
    payload = attention_payload(model, tok.encode("The cat sat"), tok, layers=[1], norms=True)
    assert [entry["layer"] for entry in payload["layers"]] == [1]
    assert started == ["block 0", "block 1"]


@pytest.mark.parametrize("options", [{}, {"encoding": "float32"}, {"norms": True, "layers": [1]}])
def test_attention_json_is_json_dumps_text(options: dict[str, object]) -> None:
    """The server writes /api/attention's answer with attention_json (a head at a time, so
    its event loop runs between heads): the same text as one json.dumps, quotes and all."""
    tok = get_tokenizer("byte")  # every character: quotes, a newline, a backslash, é
    payload = attention_payload(make_model(tok.vocab_size), tok.encode('Say "hé"\n\\'), tok,
                                **options)  # type: ignore[arg-type]
    assert attention_json(payload) == json.dumps(payload)
