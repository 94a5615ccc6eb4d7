"""The viewer's request checks at their limits and what its payloads name
(mutation testing, round 3)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn) is not installed")

from fastapi.testclient import TestClient

from attnlab import GPT, GPTConfig, ServeConfig, create_app
from attnlab.model.trace import Trace
from attnlab.tokenizers import get_tokenizer
from attnlab.viewer.payloads import attention_payload, heads_payload

CORPUS = "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ.,;:!?'\n0123456789"


@pytest.fixture(scope="module")
def setup() -> tuple[GPT, Any, TestClient]:
    tok = get_tokenizer("char", CORPUS)
    torch.manual_seed(0)
    model = GPT(GPTConfig.from_name("nano", vocab_size=tok.vocab_size)).eval()
    app = create_app(model, tok, config=ServeConfig(max_text_chars=20, max_body_bytes=4096,
                                                    max_new_tokens=40))
    return model, tok, TestClient(app)


def test_requests_exactly_at_the_limits_are_served(setup: tuple[GPT, Any, TestClient]) -> None:
    model, _, client = setup
    block, vocab = model.config.block_size, model.config.vocab_size
    assert client.post("/api/attention", json={"text": "a" * 20}).status_code == 200
    assert client.post("/api/attention", json={"text": "a" * 21}).status_code == 422
    ok = client.post("/api/attention", json={"ids": [vocab - 1] * block, "layers": [0]})
    assert ok.status_code == 200 and len(ok.json()["tokens"]) == block
    r = client.post("/api/attention", json={"ids": [1] * (block + 1)})
    assert r.status_code == 422 and f"at most block_size={block}" in r.json()["error"]
    r = client.post("/api/attention", json={"ids": [1, vocab]})  # one past the last id
    assert r.status_code == 422, r.text
    assert f"token ids [{vocab}] are outside the vocabulary [0, {vocab})" in r.json()["error"]
    r = client.post("/api/attention", json={"ids": [-1]})
    assert r.status_code == 422 and "outside the vocabulary" in r.json()["error"]


@pytest.mark.parametrize(("field", "value"), [("max_text_chars", 0), ("max_body_bytes", 0),
                                              ("max_new_tokens", 0), ("max_weights", 0),
                                              ("decimals", 0), ("decimals", 9)])
def test_serve_limits_of_zero_are_refused(field: str, value: int) -> None:
    with pytest.raises(ValueError, match=rf"ServeConfig\.{field}={value}"):
        ServeConfig(**{field: value})
    ServeConfig(**{field: 1})


def test_repeated_layers_are_answered_once_and_named_by_index(
        setup: tuple[GPT, Any, TestClient]) -> None:
    model, tok, _ = setup
    payload = attention_payload(model, tok.encode("The cat"), tok, layers=[1, 0, 1])
    assert [entry["layer"] for entry in payload["layers"]] == [1, 0]


def test_future_max_reports_attention_past_the_query(setup: tuple[GPT, Any, TestClient],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """future_max is the page's proof of the mask: the largest weight on a later key, not the
    smallest (a leaking model must show it)."""
    model, tok, _ = setup
    real_get = Trace.get

    def leaking(self: Trace, name: str, layer: int) -> torch.Tensor:
        weights = real_get(self, name, layer).clone()
        if name == "attn_weights":
            weights[..., 0, 1] = 0.25  # query 0 sees key 1
        return weights

    monkeypatch.setattr(Trace, "get", leaking)
    payload = attention_payload(model, tok.encode("abc"), tok, layers=[0])
    assert payload["layers"][0]["future_max"] == 0.25


def test_heads_payload_names_ablated_heads_as_layer_then_head(
        setup: tuple[GPT, Any, TestClient]) -> None:
    model, tok, _ = setup
    payload = heads_payload(model, tok, tok.encode("abcabc"), [(1, 0)])
    assert payload["ablated"] == [[1, 0]]


def test_a_prompt_exactly_as_long_as_the_context_is_cut_to_leave_room() -> None:
    from attnlab.viewer.payloads import DEFAULT_TEXT, sample_texts

    tok = get_tokenizer("char", DEFAULT_TEXT)
    assert sample_texts(tok, 8)["prompt"] == "The cat"  # 7 tokens of 8: room for one
    assert sample_texts(tok, 7)["prompt"] == "The"  # 7 of 7: none, so half the context
