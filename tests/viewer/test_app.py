"""viewer/app.py and routes/: the viewer's HTTP API answers with the model's own numbers, rejects
bad input with a 4xx JSON error, streams generations, and stays correct under concurrent load."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn) is not installed")

from fastapi.testclient import TestClient

from attnlab import GPT, GPTConfig, ServeConfig, Trace, create_app
from attnlab.checkpoint import save_checkpoint
from attnlab.cli import main
from attnlab.model.runtime import release_kept_memory
from attnlab.tokenizers import Tokenizer, get_tokenizer
from attnlab.viewer.app import attention_payload
from helpers import serving

CORPUS = "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ.,;:!?'\n0123456789"


def make_tokenizer() -> Tokenizer:
    return get_tokenizer("char", CORPUS)


def make_model(vocab_size: int, **overrides: Any) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig.from_name("nano", vocab_size=vocab_size, **overrides)).eval()


@pytest.fixture(scope="module")
def setup() -> tuple[GPT, Tokenizer, TestClient]:
    tok = make_tokenizer()
    model = make_model(tok.vocab_size)
    app = create_app(model, tok, meta={"step": 12, "val_loss": 3.5},
                     config=ServeConfig(max_text_chars=500, max_body_bytes=4096,
                                        max_new_tokens=40))
    return model, tok, TestClient(app)


def sse_events(body: str) -> list[tuple[str, Any]]:
    events = []
    for block in body.strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.split("\n"))
        events.append((fields["event"], json.loads(fields["data"])))
    return events


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
                                    "/api/lens"}
    body = schema["components"]["schemas"]["GenerateRequest"]["properties"]
    assert body["temperature"]["maximum"] == 5.0 and body["max_new_tokens"]["maximum"] == 40


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
    for name, kind in [("app.js", "text/javascript"), ("draw.js", "text/javascript"),
                       ("style.css", "text/css")]:
        r = client.get(f"/static/{name}")
        assert r.status_code == 200 and r.headers["content-type"].startswith(kind)
        # works offline: nothing is fetched from another host
        assert "http://" not in r.text and "https://" not in r.text
    assert "https://" not in page.text and "http://" not in page.text


# ----------------------------------------------------------------------------- generation


def greedy_without_cache(model: GPT, ids: list[int], n: int) -> list[int]:
    """Reference decode: full recomputation each step, no KV cache, argmax."""
    out = list(ids)
    with torch.no_grad():
        for _ in range(n):
            logits = model(torch.tensor([out])).logits  # (1, T, V)
            out.append(int(logits[0, -1].argmax()))
    return out[len(ids):]


def test_generate_streams_tokens_then_done(setup: tuple[GPT, Tokenizer, TestClient]) -> None:
    model, tok, client = setup
    r = client.post("/api/generate", json={"text": "The cat", "max_new_tokens": 6,
                                           "temperature": 0})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r.text)
    kinds = [kind for kind, _ in events]
    assert kinds == ["start"] + ["token"] * 6 + ["done"]
    assert events[0][1] == {"prompt_ids": tok.encode("The cat")}
    new = [data["id"] for _, data in events[1:-1]]
    assert new == greedy_without_cache(model, tok.encode("The cat"), 6)
    done = events[-1][1]
    assert done["ids"] == tok.encode("The cat") + new
    assert done["reason"] == "max_new_tokens" and done["new_tokens"] == 6
    assert "".join(data["text"] for _, data in events[1:-1]) == done["text"] == tok.decode(new)


def test_generate_same_seed_same_tokens(setup: tuple[GPT, Tokenizer, TestClient]) -> None:
    client = setup[2]
    body = {"text": "abc", "max_new_tokens": 10, "temperature": 1.0, "seed": 3}
    first = sse_events(client.post("/api/generate", json=body).text)[-1][1]["ids"]
    again = sse_events(client.post("/api/generate", json=body).text)[-1][1]["ids"]
    other = sse_events(client.post("/api/generate", json={**body, "seed": 4}).text)[-1][1]["ids"]
    assert first == again and first != other


@pytest.mark.parametrize("sampling", [{"top_k": 1}, {"top_p": 1e-6}, {"temperature": 0}])
def test_generate_narrowest_sampling_is_greedy(
    setup: tuple[GPT, Tokenizer, TestClient], sampling: dict[str, Any]
) -> None:
    model, tok, client = setup
    body = {"text": "Once", "max_new_tokens": 8, "temperature": 1.5, "seed": 0, **sampling}
    done = sse_events(client.post("/api/generate", json=body).text)[-1][1]
    assert done["ids"][4:] == greedy_without_cache(model, tok.encode("Once"), 8)


def test_streamed_pieces_add_up_to_the_text_with_bytes() -> None:
    """Byte tokens can split a character: the stream holds it back until it is whole."""
    tok = get_tokenizer("byte")
    client = TestClient(create_app(make_model(tok.vocab_size), tok))
    for seed in range(3):
        body = {"text": "héllo", "max_new_tokens": 20, "temperature": 2.0, "seed": seed}
        events = sse_events(client.post("/api/generate", json=body).text)
        done = events[-1][1]
        new = done["ids"][len(tok.encode("héllo")):]
        streamed = "".join(data["text"] for kind, data in events if kind == "token")
        assert streamed == done["text"] == tok.decode(new)


def test_generate_stops_when_the_context_is_full(
    setup: tuple[GPT, Tokenizer, TestClient],
) -> None:
    client = setup[2]
    # as `attnlab generate`: block_size - P + 1 new tokens, the last one never fed back
    r = client.post("/api/generate", json={"text": "a" * 28, "max_new_tokens": 40})
    done = sse_events(r.text)[-1][1]
    assert done["reason"] == "block_size" and done["new_tokens"] == 5 and len(done["ids"]) == 33
    r = client.post("/api/generate", json={"text": "a" * 32, "max_new_tokens": 40})
    assert sse_events(r.text)[-1][1]["new_tokens"] == 1


def test_missing_extra_names_the_install_command(
    setup: tuple[GPT, Tokenizer, TestClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    model, tok, _ = setup
    monkeypatch.setitem(sys.modules, "fastapi", None)  # makes `import fastapi` fail
    with pytest.raises(ImportError, match=r"pip install 'attnlab\[serve\]'"):
        create_app(model, tok)


def test_cli_rejects_a_bad_port(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "some/dir", "--port", "70000"]) == 1
    assert "--port 70000 is not a TCP port" in capsys.readouterr().err


def test_cli_port_in_use_is_one_line_and_no_banner(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the "serving at" banner came first, then uvicorn's own error about the address
    tok = make_tokenizer()
    save_checkpoint(tmp_path / "ckpt", make_model(tok.vocab_size), tok)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["serve", str(tmp_path / "ckpt"), "--port", str(port)]) == 1
    err = capsys.readouterr().err
    assert err == (f"attnlab serve: error: port {port} on 127.0.0.1 is in use; pass --port N "
                   f"for another (e.g. --port {port + 1})\n")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_cli_serves_a_checkpoint(tmp_path: Path) -> None:
    """`attnlab serve CHECKPOINT --port P` in a subprocess answers with that checkpoint."""
    tok = make_tokenizer()
    model = make_model(tok.vocab_size)
    save_checkpoint(tmp_path / "ckpt", model, tok, meta={"step": 7})
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "attnlab", "serve", str(tmp_path / "ckpt"), "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "attnlab serve did not answer within 30 s"
            try:
                info = httpx.get(f"http://127.0.0.1:{port}/api/model", timeout=2).json()
                break
            except httpx.TransportError:
                time.sleep(0.2)
        assert info["config"] == model.config.to_dict() and info["meta"] == {"step": 7}
        r = httpx.post(f"http://127.0.0.1:{port}/api/attention", json={"text": "hi"}, timeout=10)
        expected = attention_payload(model, tok.encode("hi"), tok)
        assert r.json() == json.loads(json.dumps(expected))
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=10)
    assert f"at http://127.0.0.1:{port}/" in err


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


# ----------------------------------------------------------------------------- live server


@pytest.fixture(scope="module")
def live(setup: tuple[GPT, Tokenizer, TestClient]) -> Iterator[tuple[str, list[int]]]:
    """uvicorn serving the app on a free loopback port, in a thread."""

    tok = setup[1]
    # a long context, so a generation runs long enough to be cut off mid-stream
    model = make_model(tok.vocab_size, block_size=1024)
    calls = [0]
    model.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    app = create_app(model, tok, config=ServeConfig(max_new_tokens=1000))
    app.state.forward_calls = calls
    with serving(app, log_level="error") as port:
        yield f"http://127.0.0.1:{port}", calls


def raw_get(base: str, path: str) -> bytes:
    """A GET sent byte for byte, so no client normalizes `..` out of the path first."""
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


@pytest.mark.parametrize(
    "path",
    ["/static/../app.py", "/static/..%2Fapp.py", "/static/%2e%2e%2f%2e%2e%2fpyproject.toml",
     "/static/../../../../etc/passwd", "/static/..\\app.py", "/../app.py",
     "/static//etc/passwd", "/static/web", "/static/"],
)
def test_no_file_outside_the_static_directory(live: tuple[str, list[int]], path: str) -> None:
    reply = raw_get(live[0], path)
    status = int(reply.split(b" ", 2)[1])
    assert 400 <= status < 500, reply[:200]
    assert b"import" not in reply and b"root:" not in reply and b"[project]" not in reply


def test_client_leaving_mid_stream_stops_the_generation(live: tuple[str, list[int]]) -> None:
    base, calls = live
    with httpx.Client(base_url=base, timeout=10) as client:
        body = {"text": "a", "max_new_tokens": 1000, "temperature": 1.0}
        before = calls[0]
        with client.stream("POST", "/api/generate", json=body) as r:
            assert "event: token" in r.iter_lines()  # after `start`: generating
        time.sleep(0.5)
        stopped_at = calls[0]
        time.sleep(0.5)
        assert calls[0] == stopped_at, "the server kept generating for a client that left"
        assert stopped_at - before < 1000
        start = time.monotonic()
        r2 = client.post("/api/attention", json={"text": "still here"})
        assert r2.status_code == 200 and time.monotonic() - start < 5


def test_load_200_requests_from_8_clients(live: tuple[str, list[int]]) -> None:
    """Concurrent requests get exactly the single-request answers; malformed ones get 4xx."""
    texts = ["The cat sat on the mat.", "Hello, world!", "abc" * 9]
    gen_body = {"text": "The", "max_new_tokens": 8, "temperature": 1.0, "top_k": 20,
                "seed": 11}
    bad_bodies = [{"text": ""}, {"text": "a" * 1025}, {"ids": [10**6]}, {"txt": "a"}]
    base = live[0]
    with httpx.Client(base_url=base, timeout=20) as client:
        single = {t: client.post("/api/attention", json={"text": t}).content for t in texts}
        single_gen = client.post("/api/generate", json=gen_body).text

    def one(n: int, client: httpx.Client) -> str:
        if n % 25 == 7:
            r = client.post("/api/attention", json=bad_bodies[n % len(bad_bodies)])
            return "4xx" if 400 <= r.status_code < 500 and "error" in r.json() else r.text
        if n % 10 == 3:
            r = client.post("/api/generate", json=gen_body)
            return "ok" if r.status_code == 200 and r.text == single_gen else r.text
        text = texts[n % len(texts)]
        r = client.post("/api/attention", json={"text": text})
        return "ok" if r.status_code == 200 and r.content == single[text] else r.text[:200]

    clients = [httpx.Client(base_url=base, timeout=20) for _ in range(8)]
    start = time.monotonic()
    try:
        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(lambda n: one(n, clients[n % 8]), range(200)))
    finally:
        for c in clients:
            c.close()
    elapsed = time.monotonic() - start
    assert results.count("4xx") == 8
    assert results.count("ok") == 192, [r for r in results if r not in ("ok", "4xx")][:3]
    assert elapsed < 60, f"200 requests took {elapsed:.1f} s"
