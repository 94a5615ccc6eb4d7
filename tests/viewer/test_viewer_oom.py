"""The viewer when the device runs out of memory: the request that ran out gets a JSON error
naming the limits to lower (503; a stream's `error` event), and the next request is served.
`torch.OutOfMemoryError` is injected on the CPU: the model's forward raises it once."""

from __future__ import annotations

from typing import Any

import pytest
import torch

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient

from attnlab import GPT, GPTConfig, ServeConfig, create_app
from attnlab.tokenizers import get_tokenizer

CUDA_OOM = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
            "79.19 GiB of which 1.06 GiB is free. Of the allocated memory 76.2 GiB is allocated "
            "by PyTorch")


def _sse(body: str) -> list[tuple[str, str]]:
    return [(block.split("\n")[0].removeprefix("event: "), block.split("\n")[1])
            for block in body.strip().split("\n\n")]


@pytest.fixture()
def app_and_model(monkeypatch: pytest.MonkeyPatch) -> tuple[TestClient, dict[str, int]]:
    """A served model whose next `armed["calls"]` forward passes raise OutOfMemoryError."""
    tok = get_tokenizer("char", "abcdefghijklmnopqrstuvwxyz .")
    torch.manual_seed(0)
    model = GPT(GPTConfig.from_name("nano", vocab_size=tok.vocab_size)).eval()
    armed = {"calls": 0}
    forward = model.forward

    def failing(*args: Any, **kwargs: Any) -> Any:
        if armed["calls"]:
            armed["calls"] -= 1
            raise torch.OutOfMemoryError(CUDA_OOM)
        return forward(*args, **kwargs)

    monkeypatch.setattr(model, "forward", failing)
    app = create_app(model, tok, config=ServeConfig(max_text_chars=300, max_weights=50_000))
    return TestClient(app), armed


@pytest.mark.parametrize("route", ["/api/attention", "/api/heads", "/api/lens"])
def test_a_json_route_answers_503_naming_the_limits_then_serves(
    route: str, app_and_model: tuple[TestClient, dict[str, int]]
) -> None:
    client, armed = app_and_model
    armed["calls"] = 1
    r = client.post(route, json={"text": "the cat sat"})
    assert r.status_code == 503, r.text
    error = r.json()["error"]
    assert error.startswith("out of memory on cpu for this request (CUDA out of memory. Tried "
                            "to allocate 2.00 GiB)"), error
    assert "--max_text_chars 300" in error and "--max_weights 50000" in error
    assert r.json()["detail"] == []
    again = client.post(route, json={"text": "the cat sat"})
    assert again.status_code == 200, again.text


def test_a_generation_ends_with_an_error_event_then_the_next_one_runs(
    app_and_model: tuple[TestClient, dict[str, int]]
) -> None:
    client, armed = app_and_model
    armed["calls"] = 1  # the prefill
    r = client.post("/api/generate", json={"text": "the cat", "max_new_tokens": 5,
                                           "temperature": 0})
    assert r.status_code == 200
    events = _sse(r.text)
    assert [e for e, _ in events] == ["start", "error"], events
    assert "out of memory on cpu for this request" in events[1][1]
    assert "--max_new_tokens 1024" in events[1][1]
    events = _sse(client.post("/api/generate", json={"text": "the cat", "max_new_tokens": 5,
                                                     "temperature": 0}).text)
    assert [e for e, _ in events] == ["start"] + ["token"] * 5 + ["done"], events
