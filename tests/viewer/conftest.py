"""Fixtures shared by the viewer's test files: `setup`, the model, tokenizer and TestClient
that test_app.py and test_app_serve.py ask about (a file that defines its own `setup`, as
test_interventions.py and test_viewer_api.py do, uses that one)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from attnlab import GPT, ServeConfig, create_app
from attnlab.tokenizers import Tokenizer
from helpers import make_model, make_tokenizer

if TYPE_CHECKING:
    from fastapi.testclient import TestClient


@pytest.fixture(scope="module")
def setup() -> tuple[GPT, Tokenizer, TestClient]:
    from fastapi.testclient import TestClient  # the serve extra: its test files skip without it

    tok = make_tokenizer()
    model = make_model(tok.vocab_size)
    app = create_app(model, tok, meta={"step": 12, "val_loss": 3.5},
                     config=ServeConfig(max_text_chars=500, max_body_bytes=4096,
                                        max_new_tokens=40))
    return model, tok, TestClient(app)
