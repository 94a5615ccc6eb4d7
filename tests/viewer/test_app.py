"""viewer/app.py and routes/: the viewer's HTTP API answers with the model's own numbers, rejects
bad input with a 4xx JSON error, and serves its page (generation, `attnlab serve` and a live
server under load: test_app_serve.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn) is not installed")

from fastapi.testclient import TestClient

from attnlab import GPT, ServeConfig, Trace, create_app
from attnlab.model.runtime import release_kept_memory
from attnlab.tokenizers import Tokenizer
from attnlab.viewer.routes.page import WEB_DIR
from helpers import make_model, make_tokenizer

# ----------------------------------------------------------------------------- attention


def test_attention_equals_the_models_trace(setup: tuple[GPT, Tokenizer, TestClient]) -> None:
    model, tok, client = setup
    text = "The cat sat."
    r = client.post("/api/attention", json={"text": text, "norms": True})
    assert r.status_code == 200, r.text
    data = r.json()
    ids = tok.encode(text)
    assert [t["id"] for t in data["tokens"]] == ids
    assert [t["text"] for t in data["tokens"]] == list(text)
    trace = Trace(names=["attn_weights", "q", "k", "v"])
    with torch.no_grad():
        model(torch.tensor([ids]), trace=trace)
    assert [lay["layer"] for lay in data["layers"]] == [0, 1]
    for lay in data["layers"]:
        expected = trace.get("attn_weights", lay["layer"])[0]  # (nh, T, T)
        assert len(lay["heads"]) == model.config.n_head
        for h, rows in enumerate(lay["heads"]):
            assert [len(row) for row in rows] == list(range(1, len(ids) + 1))
            for i, row in enumerate(rows):
                # rounded to 5 decimals: within half a unit of the last place
                torch.testing.assert_close(
                    torch.tensor(row, dtype=torch.float64), expected[h, i, : i + 1].double(),
                    atol=5.01e-6, rtol=0,
                )
                assert not expected[h, i, i + 1:].any()  # the mask, not rounding, made them 0
        assert lay["future_max"] == 0.0
        q_norm = trace.get("q", lay["layer"])[0].norm(dim=-1)  # (nh, T)
        torch.testing.assert_close(
            torch.tensor(lay["norms"]["q"]), q_norm, atol=5.01e-5, rtol=0
        )


def test_float32_encoding_holds_the_traces_exact_weights(
    setup: tuple[GPT, Tokenizer, TestClient]
) -> None:
    # the page's encoding: number lists of 5 decimals took 3.2 s of a 2,000-token answer
    # (71 MB), base64 float32 0.55 s (43 MB)
    import base64

    import numpy as np

    model, tok, client = setup
    ids = tok.encode("The cat sat.")
    data = client.post("/api/attention", json={"ids": ids, "encoding": "float32"}).json()
    trace = Trace(names="attn_weights").run(model, torch.tensor([ids]))
    T = len(ids)
    below = torch.ones(T, T, dtype=torch.bool).tril()
    for lay in data["layers"]:
        weights = trace.get("attn_weights", lay["layer"])[0]  # (nh, T, T)
        for h, head in enumerate(lay["heads"]):
            flat = torch.from_numpy(np.frombuffer(base64.b64decode(head), dtype="<f4").copy())
            assert torch.equal(flat, weights[h][below])  # row i: keys 0..i, exact


def test_attention_by_ids_and_layer_filter(setup: tuple[GPT, Tokenizer, TestClient]) -> None:
    _, tok, client = setup
    by_text = client.post("/api/attention", json={"text": "hello"}).json()
    by_ids = client.post(
        "/api/attention", json={"ids": tok.encode("hello"), "layers": [1]}
    ).json()
    assert by_ids["tokens"] == by_text["tokens"]
    assert len(by_ids["layers"]) == 1 and by_ids["layers"][0] == by_text["layers"][1]
    assert "norms" not in by_ids["layers"][0]


def test_model_info(setup: tuple[GPT, Tokenizer, TestClient]) -> None:
    model, tok, client = setup
    info = client.get("/api/model").json()
    assert info["config"] == model.config.to_dict()
    assert info["n_params"] == sum(p.numel() for p in model.parameters())
    assert info["tokenizer"] == {"name": "char", "vocab_size": tok.vocab_size, "eot_id": None}
    assert info["meta"] == {"step": 12, "val_loss": 3.5}
    assert info["limits"]["max_tokens"] == model.config.block_size


def test_openapi_schema_lists_the_api(setup: tuple[GPT, Tokenizer, TestClient]) -> None:
    schema = setup[2].get("/openapi.json").json()
    assert set(schema["paths"]) == {"/api/model", "/api/attention", "/api/generate", "/api/heads",
                                    "/api/lens", "/api/routing"}
    body = schema["components"]["schemas"]["GenerateRequest"]["properties"]
    assert body["temperature"]["maximum"] == 5.0 and body["max_new_tokens"]["maximum"] == 40


def test_requests_of_every_length_keep_no_buffers_after_them() -> None:
    """A traced forward's (nh, T, T) buffers are kept for reuse by exact size; a server
    answering texts of every length would pile them up to 2 GiB (seen with `attnlab serve`
    on a 2-layer model: RSS 256 MB -> 1.6 GB over 300 texts of 20-800 tokens)."""
    tok = make_tokenizer()
    client = TestClient(create_app(make_model(tok.vocab_size, block_size=1024), tok))
    release_kept_memory()
    for n in (800, 900):  # 2 heads x n^2 float32 weights: past runtime's 4 MiB minimum
        body = {"text": "ab" * (n // 2), "layers": [0]}
        assert client.post("/api/attention", json=body).status_code == 200
        assert client.post("/api/heads", json={"text": body["text"]}).status_code == 200
        assert release_kept_memory() == 0


# ----------------------------------------------------------------------------- bad input

TOO_LONG = "a" * 33  # nano's block_size is 32


@pytest.mark.parametrize(
    ("path", "body", "status", "message"),
    [
        ("/api/attention", {"text": ""}, 422, "text is empty"),
        ("/api/attention", {"text": "naïve"}, 422, "cannot encode character 'ï' at position 2"),
        ("/api/attention", {"text": TOO_LONG}, 422, "33 tokens; the model sees at most"),
        ("/api/attention", {"text": "a" * 501}, 422, "501 characters; the limit is 500"),
        ("/api/attention", {"ids": [1, 999]}, 422, "outside the vocabulary"),
        ("/api/attention", {"ids": []}, 422, "ids is empty"),
        ("/api/attention", {}, 422, "exactly one of 'text' or 'ids'"),
        ("/api/attention", {"text": "a", "ids": [1]}, 422, "exactly one of 'text' or 'ids'"),
        ("/api/attention", {"text": "a", "layers": [2]}, 422, "layer indices in [0, 2)"),
        ("/api/attention", {"text": "a", "layers": []}, 422, "non-empty list"),
        ("/api/attention", {"text": 7}, 422, "text: Input should be a valid string"),
        ("/api/attention", {"text": "a", "colour": 1}, 422, "colour: Extra inputs"),
        ("/api/attention", {"text": "a", "norms": "yes"}, 422, "norms: Input should be a valid"),
        ("/api/attention", b"{not json", 422, "body is not valid JSON"),
        ("/api/attention", b"[1, 2]", 422, "valid dictionary"),
        ("/api/attention", b'{"text": "\xff"}', 400, "byte 10 of the body (0xff) is not UTF-8"),
        ("/api/attention", {"text": "a" * 5000}, 413, "larger than 4096 bytes"),
        ("/api/generate", {"text": "hi", "temperature": -0.5}, 422, "temperature: Input should"),
        ("/api/generate", b'{"text": "hi", "temperature": NaN}', 422, "finite number"),
        ("/api/generate", {"text": "hi", "top_p": 0}, 422, "top_p: Input should be greater"),
        ("/api/generate", {"text": "hi", "top_k": 0}, 422, "top_k: Input should be greater"),
        ("/api/generate", {"text": "hi", "min_p": 1.5}, 422, "min_p: Input should be less"),
        ("/api/generate", {"text": "hi", "repetition_penalty": 0}, 422,
         "repetition_penalty: Input should be greater"),
        ("/api/generate", {"text": "hi", "typical_p": 0}, 422, "typical_p: Input should be great"),
        ("/api/generate", {"text": "hi", "no_repeat_ngram_size": -1}, 422,
         "no_repeat_ngram_size: Input should be greater"),
        ("/api/generate", {"text": "hi", "top_k": 10**6}, 422, "top_k: Input should be less"),
        ("/api/generate", {"text": "hi", "max_new_tokens": 41}, 422, "less than or equal to 40"),
        ("/api/generate", {"text": "hi", "max_new_tokens": 0}, 422, "greater than or equal"),
        ("/api/generate", {"text": "hi", "seed": -1}, 422, "seed: Input should"),
        ("/api/generate", {"text": "hi", "seed": 2**53}, 422, "equal to 9007199254740991"),
        ("/api/generate", {"text": "a" * 33}, 422, "at most block_size=32: shorten it to 32"),
        ("/api/generate", {"text": ""}, 422, "text is empty"),
        ("/api/generate", {}, 422, "text: Field required"),
    ],
)
def test_bad_requests_get_a_clear_4xx(
    setup: tuple[GPT, Tokenizer, TestClient], path: str, body: Any, status: int, message: str
) -> None:
    client = setup[2]
    if isinstance(body, bytes):
        r = client.post(path, content=body, headers={"content-type": "application/json"})
    else:
        r = client.post(path, json=body)
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    assert message in r.json()["error"]


@pytest.mark.parametrize(
    ("content_type", "body", "message"),
    [
        # curl -d '{"text": "hi"}' without -H: a JSON text that nothing parses as JSON
        ("application/x-www-form-urlencoded", b'{"text": "hi"}',
         "Content-Type: application/json (this one came as 'application/x-www-form-urlencoded'"),
        ("text/plain", b'{"text": "hi"}', "-H 'Content-Type: application/json'"),
        ("application/json", b"[1, 2]", 'send a JSON object, e.g. {"text": "..."}'),
        ("application/json", b"", 'send a JSON object, e.g. {"text": "..."}'),
    ],
)
def test_a_body_that_is_no_json_object_says_what_to_send(
    setup: tuple[GPT, Tokenizer, TestClient], content_type: str, body: bytes, message: str
) -> None:
    r = setup[2].post("/api/attention", content=body, headers={"content-type": content_type})
    assert r.status_code == 422, r.text
    assert message in r.json()["error"]


def test_too_many_weights_asks_for_fewer_layers() -> None:
    tok = make_tokenizer()
    client = TestClient(create_app(make_model(tok.vocab_size), tok,
                                   config=ServeConfig(max_weights=2 * 2 * 55)))
    r = client.post("/api/attention", json={"text": "a" * 10})  # 2 layers x 2 heads x 55
    assert r.status_code == 200
    r = client.post("/api/attention", json={"text": "a" * 11})
    assert r.status_code == 422 and 'ask for fewer layers, e.g. "layers": [0]' in r.json()["error"]
    assert client.post("/api/attention", json={"text": "a" * 11, "layers": [1]}).status_code == 200


def test_chunked_body_over_the_limit_gets_413(
    setup: tuple[GPT, Tokenizer, TestClient],
) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"text": "'
        for _ in range(100):
            yield b"a" * 100
        yield b'"}'

    r = setup[2].post("/api/attention", content=chunks(),
                      headers={"content-type": "application/json"})
    assert r.status_code == 413 and "larger than 4096 bytes" in r.json()["error"]


def test_unknown_routes_and_methods(setup: tuple[GPT, Tokenizer, TestClient]) -> None:
    client = setup[2]
    assert client.get("/api/nope").status_code == 404
    r = client.get("/api/attention")
    assert r.status_code == 405 and r.json()["error"] == "Method Not Allowed"


# ----------------------------------------------------------------------------- page and files


def test_page_and_static_files(setup: tuple[GPT, Tokenizer, TestClient]) -> None:
    client = setup[2]
    page = client.get("/")
    assert page.status_code == 200 and 'src="/static/app.js"' in page.text
    assert "default-src 'self'" in page.headers["content-security-policy"]
    scripts = sorted(p.name for p in WEB_DIR.glob("*.js"))
    served = {"app.js", "api.js", "chips.js", "dom.js", "draw.js", "generation.js", "heads.js"}
    assert served <= set(scripts)
    for name, kind in [*((n, "text/javascript") for n in scripts), ("style.css", "text/css"),
                       ("overview.css", "text/css")]:
        r = client.get(f"/static/{name}")
        assert r.status_code == 200 and r.headers["content-type"].startswith(kind)
        # works offline: nothing is fetched from another host
        assert "http://" not in r.text and "https://" not in r.text
    assert "https://" not in page.text and "http://" not in page.text
