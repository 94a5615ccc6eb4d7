"""viewer/app.py served: /api/generate streams what greedy decoding or a seeded draw gives,
`attnlab serve` answers with its checkpoint (or one line on a bad or busy port), and a live
server keeps to its static directory, stops a generation its client left and stays correct
under concurrent load."""

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

from attnlab import GPT, ServeConfig, create_app
from attnlab.checkpoint import save_checkpoint
from attnlab.cli import main
from attnlab.tokenizers import Tokenizer, get_tokenizer
from attnlab.viewer.app import attention_payload
from helpers import first_answer, free_port, make_model, make_tokenizer, serving


def sse_events(body: str) -> list[tuple[str, Any]]:
    events = []
    for block in body.strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.split("\n"))
        events.append((fields["event"], json.loads(fields["data"])))
    return events


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


@pytest.mark.parametrize("sampling", [{"top_k": 1}, {"top_p": 1e-6}, {"temperature": 0},
                                      {"min_p": 1.0}])
def test_generate_narrowest_sampling_is_greedy(
    setup: tuple[GPT, Tokenizer, TestClient], sampling: dict[str, Any]
) -> None:
    model, tok, client = setup
    body = {"text": "Once", "max_new_tokens": 8, "temperature": 1.5, "seed": 0, **sampling}
    done = sse_events(client.post("/api/generate", json=body).text)[-1][1]
    assert done["ids"][4:] == greedy_without_cache(model, tok.encode("Once"), 8)


def test_generate_takes_a_repetition_penalty(setup: tuple[GPT, Tokenizer, TestClient]) -> None:
    """The body's repetition_penalty reaches generation (greedy too): the ids are the
    library's with the same penalty, not the plain greedy ones."""
    from attnlab.generate import generate

    model, tok, client = setup
    body = {"text": "Once", "max_new_tokens": 12, "temperature": 0, "repetition_penalty": 3.0}
    done = sse_events(client.post("/api/generate", json=body).text)[-1][1]
    prompt = torch.tensor([tok.encode("Once")])  # (1, P)
    expected = generate(model, prompt, max_new_tokens=12, temperature=0, repetition_penalty=3.0,
                        eot_id=tok.stop_ids, vocab_size=tok.vocab_size)
    assert done["ids"] == expected[0].tolist()
    assert done["ids"][4:] != greedy_without_cache(model, tok.encode("Once"), 12)


@pytest.mark.parametrize("how", [{"temperature": 0, "no_repeat_ngram_size": 1},
                                 {"temperature": 1.5, "typical_p": 0.2, "seed": 3}])
def test_generate_takes_typical_p_and_no_repeat_ngram_size(
    setup: tuple[GPT, Tokenizer, TestClient], how: dict[str, Any]
) -> None:
    """Fails before (422: extra inputs): the body's typical_p and no_repeat_ngram_size reach
    generation; the ids are the library's with the same settings, not those without."""
    from attnlab.generate import generate

    model, tok, client = setup
    body = {"text": "Once", "max_new_tokens": 12, **how}
    done = sse_events(client.post("/api/generate", json=body).text)[-1][1]
    prompt = torch.tensor([tok.encode("Once")])  # (1, P)
    expected = generate(model, prompt, max_new_tokens=12, eot_id=tok.stop_ids,
                        vocab_size=tok.vocab_size, **how)
    assert done["ids"] == expected[0].tolist()
    plain = {k: v for k, v in how.items() if k in ("temperature", "seed")}
    without = sse_events(client.post("/api/generate", json={
        "text": "Once", "max_new_tokens": 12, **plain}).text)[-1][1]
    assert without["ids"] != done["ids"]


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


def test_cli_float16_weights_with_a_dtype_are_refused_naming_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """serve told `--dtype bfloat16 --weights float16` to "use --dtype float16 or bfloat16
    instead", which it had; the fix is to drop --dtype (as generate says)."""
    assert main(["serve", str(tmp_path / "ckpt"), "--weights", "float16",
                 "--dtype", "bfloat16"]) == 1
    assert capsys.readouterr().err == ("attnlab serve: error: --weights float16 computes in "
                                       "float32; drop --dtype bfloat16\n")


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
        info = first_answer(proc, f"http://127.0.0.1:{port}/api/model", 30).json()
        assert info["config"] == model.config.to_dict() and info["meta"] == {"step": 7}
        r = httpx.post(f"http://127.0.0.1:{port}/api/attention", json={"text": "hi"}, timeout=10)
        expected = attention_payload(model, tok.encode("hi"), tok)
        assert r.json() == json.loads(json.dumps(expected))
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=10)
    assert f"at http://127.0.0.1:{port}/" in err


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
