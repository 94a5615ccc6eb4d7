"""An app's model lives as long as the app and no longer: FastAPI caches endpoint callables
module-wide, and routes that closed over their state kept every dropped app's model alive (a
notebook serving model after model held them all)."""

from __future__ import annotations

import gc
import weakref

import pytest

pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn) is not installed")

from fastapi.testclient import TestClient

from attnlab import create_app
from helpers import make_model, make_tokenizer


def test_a_dropped_app_lets_its_model_go() -> None:
    """Every route called once (model, attention, generate, heads, lens), then the app and
    its client dropped: the model is freed. While the app lives, it keeps the model alive
    though the caller dropped its own reference."""
    tok = make_tokenizer()
    model = make_model(tok.vocab_size)
    gone = weakref.ref(model)
    app = create_app(model, tok)
    del model
    gc.collect()
    assert gone() is not None  # the app holds its state, and so the model
    with TestClient(app) as client:
        assert client.get("/api/model").status_code == 200
        for route, body in [("attention", {"text": "the cat"}),
                            ("generate", {"text": "the", "max_new_tokens": 2}),
                            ("heads", {"text": "the cat"}), ("lens", {"text": "the cat"})]:
            assert client.post(f"/api/{route}", json=body).status_code == 200, route
    del app, client
    gc.collect()
    assert gone() is None
