"""viewer/app.py under a busy model, served by uvicorn: requests wait their turn without holding
the threadpool (the page's static files still load), a request whose client left while it
waited is not computed, one whose client leaves while it computes stops at its next block, a
stopping server stops the call under way, ends its open generations and refuses waiting
requests, a big answer is encoded off the event loop, and `attnlab serve` stops on Ctrl-C or
SIGTERM mid-stream with one line.

The model is held busy by a forward hook that waits on an event (`Gate`), so each test says
what happens while it is busy without depending on how fast this machine is.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn) is not installed")

import attnlab.generate as generation
from attnlab import ServeConfig, create_app
from attnlab.checkpoint import save_checkpoint
from helpers import first_answer, free_port, make_model, make_tokenizer, serving

WAIT = 20  # seconds: a bound that only a broken server reaches, never a measurement
N_LAYER = 6  # the `layered` model's blocks


class Gate:
    """A forward pre-hook that counts the model's calls and, while closed, holds the first call
    after `close()` until `open()`: the model is busy for as long as a test needs."""

    def __init__(self) -> None:
        self.calls = 0
        self.entered = threading.Event()  # the held call has begun
        self.free = threading.Event()
        self.free.set()

    def __call__(self, *_: Any) -> None:
        self.calls += 1
        if not self.free.is_set():
            self.entered.set()
            self.free.wait(WAIT)

    def close(self) -> None:
        self.entered.clear()
        self.free.clear()

    def open(self) -> None:
        self.free.set()


@pytest.fixture(scope="module")
def busy() -> Iterator[tuple[str, Gate, threading.Event]]:
    """uvicorn serving a nano model (block_size 256) whose forward `Gate` can hold, with the
    app's `stopping` event."""
    tok = make_tokenizer()
    model = make_model(tok.vocab_size, block_size=256)
    gate = Gate()
    model.register_forward_pre_hook(gate)  # a trace stops its pass early: no post-hook
    stopping = threading.Event()
    app = create_app(model, tok, config=ServeConfig(max_new_tokens=250), stopping=stopping)
    with serving(app, log_level="error") as port:
        yield f"http://127.0.0.1:{port}", gate, stopping


class Blocks:
    """Forward pre-hooks that count the blocks a model begins (`begun`), the first block's
    holding it (`gate`, a `Gate`) so that a call stops in the middle of a pass."""

    def __init__(self, model: Any) -> None:
        self.begun = 0
        self.gate = Gate()
        for block in model.blocks:
            block.register_forward_pre_hook(self.count)
        model.blocks[0].register_forward_pre_hook(self.gate)

    def count(self, *_: Any) -> None:
        self.begun += 1


@pytest.fixture(scope="module")
def layered() -> Iterator[tuple[str, Blocks, threading.Event]]:
    """uvicorn serving a nano model of N_LAYER blocks whose pass `Blocks` counts and can hold
    before its first block, with the app's `stopping` event."""
    tok = make_tokenizer()
    model = make_model(tok.vocab_size, block_size=256, n_layer=N_LAYER)
    blocks = Blocks(model)
    stopping = threading.Event()
    app = create_app(model, tok, config=ServeConfig(max_new_tokens=200), stopping=stopping)
    with serving(app, log_level="error") as port:
        yield f"http://127.0.0.1:{port}", blocks, stopping


@pytest.fixture
def decodes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The generations' decode steps: one entry per new token past the first."""
    steps: list[int] = []
    decode_one_token = generation.decode_one_token

    def counted(*args: Any) -> Any:
        steps.append(1)
        return decode_one_token(*args)

    monkeypatch.setattr(generation, "decode_one_token", counted)
    return steps


def raw_post(base: str, path: str, body: dict[str, Any]) -> socket.socket:
    """A POST sent on a socket of its own, the answer left unread (close it to leave)."""
    host, port = base.removeprefix("http://").split(":")
    data = json.dumps(body).encode()
    sock = socket.create_connection((host, int(port)), timeout=WAIT)
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    return sock


def hold_the_model(base: str, gate: Gate, pool: ThreadPoolExecutor) -> Any:
    """Start an /api/attention request and return its future once the gate holds it."""
    gate.close()
    held = pool.submit(httpx.post, base + "/api/attention", json={"text": "held"}, timeout=WAIT)
    assert gate.entered.wait(WAIT), "the model never ran"
    return held


def test_a_request_whose_client_left_while_waiting_is_not_computed(
    busy: tuple[str, Gate, threading.Event],
) -> None:
    """Five requests queue behind a busy model and their clients leave: the server computed
    all five for no one before the next client's turn (each is seconds on a large model)."""
    base, gate, _ = busy
    with ThreadPoolExecutor(1) as pool:
        held = hold_the_model(base, gate, pool)
        left = [raw_post(base, "/api/attention", {"text": f"left {i}"}) for i in range(5)]
        time.sleep(1.0)  # they reach the server and wait (a longer wait changes nothing)
        for sock in left:
            sock.close()
        time.sleep(1.0)  # the server sees them go
        before = gate.calls
        gate.open()
        assert held.result().status_code == 200
    r = httpx.post(base + "/api/attention", json={"text": "next"}, timeout=WAIT)
    assert r.status_code == 200
    assert gate.calls - before == 1, f"{gate.calls - before - 1} requests computed for no one"


def test_the_page_loads_while_requests_wait_for_the_model(
    busy: tuple[str, Gate, threading.Event],
) -> None:
    """45 requests wait for a busy model: each held one of the 40 threadpool threads, which
    also read static files, so the page's scripts did not load until the queue drained."""
    base, gate, _ = busy
    with ThreadPoolExecutor(1) as pool:
        held = hold_the_model(base, gate, pool)
        waiting = [raw_post(base, "/api/attention", {"text": f"wait {i}"}) for i in range(45)]
        try:
            time.sleep(1.0)  # they reach the server and wait
            r = httpx.get(base + "/static/app.js", timeout=5)
            assert r.status_code == 200 and "import" in r.text
        finally:
            gate.open()
            for sock in waiting:
                sock.close()
        assert held.result().status_code == 200


def test_stopping_ends_a_generation_and_refuses_waiting_requests(
    busy: tuple[str, Gate, threading.Event],
) -> None:
    """Set `stopping` (attnlab serve does on Ctrl-C) while a generation's stream is open and
    waits for the model: it ends with an `error` event, where it ran on to max_new_tokens
    and held the server's shutdown, and an attention request waiting too gets a 503."""
    base, gate, stopping = busy
    body = {"text": "a", "max_new_tokens": 250, "temperature": 1.0}
    try:
        with httpx.Client(base_url=base, timeout=WAIT) as client, \
                ThreadPoolExecutor(2) as pool:
            held = hold_the_model(base, gate, pool)
            with client.stream("POST", "/api/generate", json=body) as r:
                lines = r.iter_lines()
                assert next(lines) == "event: start"  # the stream is open, its prefill waits
                waiting = pool.submit(client.post, "/api/attention", json={"text": "queued"})
                time.sleep(0.5)  # the attention request waits its turn too
                stopping.set()
                gate.open()
                rest = "\n".join(lines)
            # the call under way stops at its next block: the server stops within one block
            assert held.result().status_code == 503
            answer = waiting.result()
    finally:
        stopping.clear()
    _assert_stopped(rest, answer)


@pytest.mark.parametrize("path, body", [
    ("/api/attention", {"text": "left while computing"}),
    ("/api/heads", {"text": "left while computing"}),
    ("/api/lens", {"text": "left while computing"}),
])
def test_a_request_whose_client_left_while_computing_stops_at_its_next_block(
    layered: tuple[str, Blocks, threading.Event], path: str, body: dict[str, Any],
) -> None:
    """A request's client leaves while the model computes it: the server ran the rest of its
    passes for no one (the heads panel's are four), the next client waiting behind. Now it
    stops before its next block and the next request runs at once."""
    base, blocks, _ = layered
    blocks.gate.close()
    left = raw_post(base, path, body)
    assert blocks.gate.entered.wait(WAIT), "the model never ran"
    with ThreadPoolExecutor(1) as pool:
        after = pool.submit(httpx.post, base + "/api/attention", json={"text": "next"},
                            timeout=WAIT)
        left.close()
        time.sleep(1.0)  # the server sees it go (a longer wait changes nothing)
        before = blocks.begun
        blocks.gate.open()
        assert after.result().status_code == 200
    ran = blocks.begun - before - N_LAYER  # the next request's pass begins N_LAYER blocks
    assert ran == 0, f"{ran} blocks computed for a client that had left"


def test_a_generation_whose_client_left_during_its_prefill_stops(
    layered: tuple[str, Blocks, threading.Event], decodes: list[int],
) -> None:
    """A generation's client leaves after its first event (`start`), while the prompt's
    prefill computes: the prefill ran through every block for no one. Now it stops before
    the next block, decodes no token, and the next request runs at once."""
    base, blocks, _ = layered
    body = {"text": "abcd" * 32, "max_new_tokens": 120, "temperature": 1.0}
    blocks.gate.close()
    with httpx.stream("POST", base + "/api/generate", json=body, timeout=WAIT) as r:
        lines = r.iter_lines()  # kept: a dropped line iterator closes the connection
        assert next(lines) == "event: start"
        assert blocks.gate.entered.wait(WAIT), "the prefill never ran"
    with ThreadPoolExecutor(1) as pool:  # the stream above is closed: its client has left
        after = pool.submit(httpx.post, base + "/api/attention", json={"text": "next"},
                            timeout=WAIT)
        time.sleep(1.0)  # the server sees it go
        before = blocks.begun
        blocks.gate.open()
        assert after.result().status_code == 200
    ran = blocks.begun - before - N_LAYER
    assert ran == 0, f"{ran} prefill blocks computed for a client that had left"
    assert decodes == [], f"{len(decodes)} of 120 tokens decoded for no one"


def test_stopping_stops_a_prefill_under_way(
    layered: tuple[str, Blocks, threading.Event],
) -> None:
    """The server stops (Ctrl-C) while a generation's prefill computes, behind it an
    attention request: the prefill ran through every block and its first token went out
    before the stream ended. Now the stream's only event after `start` is the `error`, no
    block begins after the stop, and the waiting request gets a 503."""
    base, blocks, stopping = layered
    body = {"text": "abcd" * 32, "max_new_tokens": 120, "temperature": 1.0}
    try:
        with httpx.Client(base_url=base, timeout=WAIT) as client, ThreadPoolExecutor(1) as pool:
            blocks.gate.close()
            with client.stream("POST", "/api/generate", json=body) as r:
                lines = r.iter_lines()
                assert next(lines) == "event: start"
                assert blocks.gate.entered.wait(WAIT), "the prefill never ran"
                waiting = pool.submit(client.post, "/api/attention", json={"text": "queued"})
                time.sleep(0.5)  # the attention request waits its turn
                before = blocks.begun
                stopping.set()
                blocks.gate.open()
                rest = "\n".join(lines)
            answer = waiting.result()
    finally:
        stopping.clear()
    assert blocks.begun == before, f"{blocks.begun - before} blocks begun after the stop"
    _assert_stopped(rest, answer)


def test_a_big_answer_is_encoded_off_the_event_loop(
    busy: tuple[str, Gate, threading.Event], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """/api/attention's rounded lists (59 MB at 1000 tokens of 4 x 4 heads) were encoded by
    one json.dumps on the event loop: seconds in which no other client got an answer. Every
    json.dumps of the weights now runs in a worker thread, a head at a time."""
    base = busy[0]
    on_loop: list[bool] = []
    dumps = json.dumps

    def watched(obj: Any, *args: Any, **kwargs: Any) -> str:
        if isinstance(obj, list) or (isinstance(obj, dict) and "layers" in obj):
            try:
                asyncio.get_running_loop()
                on_loop.append(True)
            except RuntimeError:  # no loop runs in this thread
                on_loop.append(False)
        return dumps(obj, *args, **kwargs)

    monkeypatch.setattr(json, "dumps", watched)
    r = httpx.post(base + "/api/attention", json={"text": "The cat sat"}, timeout=WAIT)
    assert r.status_code == 200 and len(r.json()["layers"]) == 2
    assert on_loop and not any(on_loop), "the weights were encoded on the event loop"


def _serve_a_model(tmp_path: Path) -> tuple[subprocess.Popen[str], int]:
    """`attnlab serve` of a small saved model on a free port, as its own process."""
    tok = make_tokenizer()
    save_checkpoint(tmp_path / "ckpt", make_model(tok.vocab_size, block_size=1024), tok)
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "attnlab", "serve", str(tmp_path / "ckpt"), "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    return proc, port


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_cli_stops_mid_stream_with_one_line(tmp_path: Path, sig: signal.Signals) -> None:
    """Ctrl-C (or SIGTERM) with a generation streaming: the server ran the generation to
    max_new_tokens before it exited (minutes on a large model); SIGTERM ended it without a
    word. Now the stream ends with an `error` event, and the one `interrupted` line, 130."""
    proc, port = _serve_a_model(tmp_path)
    try:
        first_answer(proc, f"http://127.0.0.1:{port}/api/model", 30)
        body = {"text": "a", "max_new_tokens": 1000, "temperature": 1.0}
        with httpx.stream("POST", f"http://127.0.0.1:{port}/api/generate", json=body,
                          timeout=WAIT) as r:
            lines = r.iter_lines()
            assert "event: token" in lines
            proc.send_signal(sig)
            events = [line for line in lines if line.startswith("event: ")]
        status = proc.wait(WAIT)
    finally:
        if proc.poll() is None:
            proc.kill()
        _, err = proc.communicate(timeout=WAIT)
    assert events[-1] == "event: error" and events.count("event: token") < 999, events[-3:]
    assert status == 130
    assert err.splitlines()[1:] == ["attnlab serve: interrupted"], err


@pytest.mark.parametrize("presses", [1, 2])
def test_cli_stops_with_a_client_that_stopped_reading(tmp_path: Path, presses: int) -> None:
    """A client that stopped reading a big answer (19 MB of rounded weights) held Ctrl-C off
    forever: uvicorn waited for the answer to go out, and a second Ctrl-C (uvicorn's forced
    exit) printed a traceback. Now the answer is cut after SHUTDOWN_GRACE seconds, or at
    the second Ctrl-C, with the one `interrupted` line and no log of the cut."""
    proc, port = _serve_a_model(tmp_path)
    stalled = socket.socket()
    try:
        first_answer(proc, f"http://127.0.0.1:{port}/api/model", 30)
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stalled.connect(("127.0.0.1", port))
        data = json.dumps({"text": "abcdefgh" * 128}).encode()  # 1024 tokens, 2 x 2 heads
        stalled.sendall(f"POST /api/attention HTTP/1.1\r\nHost: x\r\nContent-Type: "
                        f"application/json\r\nContent-Length: {len(data)}\r\n\r\n".encode() + data)
        assert stalled.recv(12) == b"HTTP/1.1 200"  # the answer is on its way; no more is read
        for _ in range(presses):
            proc.send_signal(signal.SIGINT)
            time.sleep(0.5)
        status = proc.wait(WAIT)
    finally:
        stalled.close()
        if proc.poll() is None:
            proc.kill()
        _, err = proc.communicate(timeout=WAIT)
    assert status == 130
    assert err.splitlines()[1:] == ["attnlab serve: interrupted"], err


def _assert_stopped(rest: str, answer: httpx.Response) -> None:
    """A stream cut by the server's stop: after `start`, only an `error` event saying the
    server stops; the request that waited behind it got a 503."""
    events = [line for line in rest.split("\n") if line.startswith("event: ")]
    assert events == ["event: error"], events
    assert "attnlab serve is stopping" in rest
    assert answer.status_code == 503 and "stopping" in answer.json()["error"]


def test_apps_made_again_on_one_model_share_its_block_hooks() -> None:
    """Each app put a stop hook on every block of its model, and FastAPI's caches kept an
    app's endpoints (so its state) alive (test_app_lifetime.py): a notebook making apps again
    and again on one model piled the hooks up, every forward running them all. The apps of
    one model now share one set, and a cancelled call of one stops at its next block while
    the other's call runs on (armed per thread)."""
    import torch

    from attnlab import GPT, GPTConfig
    from attnlab.tokenizers import CharTokenizer
    from attnlab.viewer.state import _BlockStops, _Stopped

    tok = CharTokenizer(sorted(set("abc ")))
    model = GPT(GPTConfig.from_name("nano", vocab_size=tok.vocab_size)).eval()
    for _ in range(3):
        create_app(model, tok)
    assert [len(block._forward_pre_hooks) for block in model.blocks] == [1, 1]
    stops = _BlockStops.of(model)
    ids = torch.tensor([[1, 2, 3]])
    stops.armed[threading.get_ident()] = lambda: True
    try:
        with pytest.raises(_Stopped):
            model(ids)
        other = ThreadPoolExecutor(1).submit(model, ids)  # not armed there: it runs
        assert other.result().logits.shape == (1, 3, tok.vocab_size)
    finally:
        stops.armed.clear()
    model(ids)  # disarmed: runs
