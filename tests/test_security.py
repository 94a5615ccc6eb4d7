"""Security: loading never runs code from a file, and the server is local, bounded and robust.

Adds to tests/test_server.py (which checks 4xx answers, body limits through TestClient,
traversal of `..` paths and 200 mostly valid concurrent requests): a malicious pickle in a
checkpoint, a source scan for unsafe loaders, the default bind address, and a real uvicorn
server serving a saved checkpoint under load that is mostly hostile (raw sockets, lying
headers, encoded traversal, deep JSON, oversized and half-sent bodies).
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch

import attnlab
from attnlab import GPT, GPTConfig
from attnlab.checkpoint import load_train_state, save_checkpoint
from attnlab.cli import main
from attnlab.load import load_checkpoint
from attnlab.tokenizers import get_tokenizer
from helpers import serving

SRC = Path(attnlab.__file__).parent


class Payload:
    """Unpickling this calls os.mkdir(marker): code from the file, run by the loader."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return os.mkdir, (str(self.marker),)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    tok = get_tokenizer("char", "abcdefghijklmnopqrstuvwxyz ")
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, block_size=32, n_layer=1, n_head=2,
                          n_embd=16)).eval()
    return save_checkpoint(tmp_path_factory.mktemp("serve") / "ckpt", model, tok,
                           train_state={"step": 1}, meta={"step": 1})


def evil_copy(ckpt: Path, tmp_path: Path, name: str, content: Any) -> tuple[Path, Path]:
    marker = tmp_path / "pwned"
    target = tmp_path / "ckpt"
    shutil.copytree(ckpt, target)
    if isinstance(content, bytes):
        (target / name).write_bytes(content)
    else:
        torch.save(content(marker), target / name)  # what a malicious train_state.pt holds
    return target, marker


def test_a_malicious_pickle_is_refused_and_never_runs(ckpt: Path, tmp_path: Path) -> None:
    target, marker = evil_copy(ckpt, tmp_path, "train_state.pt", lambda m: {"step": Payload(m)})
    torch.load(target / "train_state.pt", weights_only=False)  # the payload is live:
    assert marker.is_dir()  # plain torch.load runs it
    marker.rmdir()
    with pytest.raises(ValueError) as refused:
        load_train_state(target)
    assert not marker.exists()
    message = str(refused.value)
    assert "GLOBAL posix.mkdir" in message and "\n" not in message
    assert "weights_only=False" not in message  # no advice to run the code after all


def test_resume_from_a_malicious_checkpoint_stops_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    flags = ["train", "--quiet", "--out", str(tmp_path / "run"), "--n_layer", "1", "--n_head",
             "1", "--n_embd", "8", "--batch_size", "2", "--eval_iters", "1", "--max_iters", "1"]
    assert main(flags) == 0
    marker = tmp_path / "pwned"
    torch.save({"step": Payload(marker)}, tmp_path / "run" / "ckpt" / "train_state.pt")
    capsys.readouterr()
    assert main([*flags[:-1], "2", "--resume"]) == 1
    err = capsys.readouterr().err
    assert "refusing or unable to load" in err and len(err.strip().splitlines()) == 1
    assert not marker.exists()


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("model.safetensors", "pickle"),  # a pickle where safetensors belongs
        ("config.json", b'__import__("os").mkdir("MARKER")'),  # Python, not JSON
        ("config.json", b"!!python/object/apply:os.mkdir [MARKER]"),  # YAML tags
        ("tokenizer_config.json", b'{"type": "char", "chars": __import__("os")}'),
    ],
)
def test_files_are_data_not_code(ckpt: Path, tmp_path: Path, name: str, content: Any) -> None:
    marker = tmp_path / "pwned"
    if content == "pickle":
        blob_path = tmp_path / "blob"
        torch.save(Payload(marker), blob_path)
        content = blob_path.read_bytes()
    target, _ = evil_copy(ckpt, tmp_path, name, content.replace(b"MARKER", str(marker).encode()))
    with pytest.raises(ValueError, match=name):
        load_checkpoint(target)
    assert not marker.exists()


def test_no_loader_in_the_package_can_run_code() -> None:
    """Every torch.load passes weights_only=True; no pickle, marshal, eval, exec or yaml."""
    torch_loads = 0
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                assert not {"pickle", "marshal", "dill", "yaml", "shelve"} & set(names), path
            if not isinstance(node, ast.Call):
                continue
            func = ast.unparse(node.func)
            assert func not in ("eval", "exec", "compile", "__import__"), (path, node.lineno)
            if func == "torch.load":
                torch_loads += 1
                kwargs = {k.arg: ast.unparse(k.value) for k in node.keywords}
                assert kwargs.get("weights_only") == "True", (path, node.lineno)
    assert torch_loads >= 2  # checkpoint.py and hf.py: the scan sees them


# ----------------------------------------------------------------------------- server


def test_serve_binds_loopback_unless_told(ckpt: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("uvicorn")
    import uvicorn

    # serve binds its socket itself (a port in use is one line) and hands it to uvicorn
    binds: list[str] = []

    def run(server: uvicorn.Server, sockets: list[socket.socket]) -> None:
        binds.append(sockets[0].getsockname()[0])
        sockets[0].close()

    monkeypatch.setattr(uvicorn.Server, "run", run)
    with socket.socket() as probe:  # a free port, so a server elsewhere on 8000 is no failure
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    assert main(["serve", str(ckpt), "--port", port]) == 0
    assert main(["serve", str(ckpt), "--host", "0.0.0.0", "--port", port]) == 0
    assert binds == ["127.0.0.1", "0.0.0.0"]
    if "fbgemm" in torch.backends.quantized.supported_engines:  # x86: float16 weights
        import attnlab.model.decode as decode_mod

        real, halved = decode_mod.half_weights, []
        monkeypatch.setattr(decode_mod, "half_weights",
                            lambda m, **kw: halved.append(real(m, **kw)))
        assert main(["serve", str(ckpt), "--port", port, "--weights", "float16"]) == 0
        assert binds[-1] == "127.0.0.1" and halved[0].decode_weights == "float16"


@pytest.fixture(scope="module")
def server(ckpt: Path) -> Iterator[tuple[str, int]]:
    """uvicorn serving the saved checkpoint on a free loopback port, in a thread."""
    pytest.importorskip("fastapi")

    from attnlab.viewer.app import ServeConfig, create_app

    saved = load_checkpoint(ckpt)
    app = create_app(saved.model, saved.tokenizer, saved.meta,
                     ServeConfig(max_body_bytes=8192, max_new_tokens=16))
    with serving(app, log_level="critical", timeout_keep_alive=1) as port:
        yield "127.0.0.1", port


def raw(server: tuple[str, int], request: bytes, *, close_after_send: bool = False) -> bytes:
    """Send bytes as they are (no client fixes them up) and read the whole answer."""
    with socket.create_connection(server, timeout=10) as s:
        s.sendall(request)
        if close_after_send:
            s.shutdown(socket.SHUT_WR)  # the client stops sending mid-body
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def status_of(reply: bytes) -> int:
    return int(reply.split(b" ", 2)[1]) if reply.startswith(b"HTTP/1.1 ") else 0


def post(path: str, body: bytes, *headers: str) -> bytes:
    head = "".join(f"{h}\r\n" for h in headers)
    if not any(h.lower().startswith("content-length") for h in headers):
        head += f"Content-Length: {len(body)}\r\n"
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            f"Content-Type: application/json\r\n{head}\r\n").encode() + body


def get(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode()


DEEP = b'{"text": "a", "layers": ' + b"[" * 3000 + b"]" * 3000 + b"}"
# (request, what must come back); paths tests/viewer/test_app_serve.py already tries are not
# repeated
HOSTILE: list[tuple[bytes, int | None]] = [
    (get("/static/%2e%2e/app.py"), 404),
    (get("/static/%252e%252e%252fapp.py"), 404),  # double-encoded
    (get("/static/..%5capp.py"), 404),  # encoded backslash
    (get("/static/app.js%00.py"), 404),  # NUL
    (get("/static/%2Fetc%2Fpasswd"), 404),  # encoded absolute path
    (get("http://127.0.0.1/static/../../pyproject.toml"), None),  # absolute-form target
    (get("/static/./app.js/../../app.py"), None),
    (post("/api/attention", b'{"text": "' + b"a" * 9000 + b'"}'), 413),
    (post("/api/attention", b"{}", "Content-Length: 99999999999999999999"), 413),
    (post("/api/attention", b"{}", "Content-Length: -1"), None),
    (post("/api/attention", b'{"ids": [' + b"1," * 3000 + b"1]}"), 422),  # tokens > block_size
    (post("/api/attention", DEEP), None),  # nesting past Python's recursion limit
    (post("/api/attention", b'{"text": "\xff\xfe"}'), None),  # not UTF-8
    (post("/api/attention", b'{"text": "\\ud800"}'), 422),  # a lone surrogate
    (post("/api/attention", b'{"ids": [1e400]}'), 422),
    (post("/api/attention", b'{"ids": [99999999999999999999999]}'), 422),
    (post("/api/generate", b'{"text": "ab", "max_new_tokens": 1e9}'), 422),
    (post("/api/generate", b'{"text": "ab", "top_k": 1e9}'), 422),
    (post("/api/generate", b'{"text": "ab", "seed": 1e30}'), 422),
    (b"BREW /api/attention HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 405),
    (b"GET /\x00 HTTP/1.1\r\nHost: x\r\n\r\n", None),  # not HTTP at all
]


@pytest.mark.parametrize(("request_bytes", "expected"), HOSTILE,
                         ids=[r.split(b"\r\n")[0][:40].decode("latin-1") + f"-{i}"
                              for i, (r, _) in enumerate(HOSTILE)])
def test_hostile_requests_get_4xx_json(server: tuple[str, int], request_bytes: bytes,
                                       expected: int | None) -> None:
    reply = raw(server, request_bytes)
    status = status_of(reply)
    assert 400 <= status < 500 and (expected is None or status == expected), reply[:300]
    head, _, body = reply.partition(b"\r\n\r\n")
    if b"application/json" in head:
        assert json.loads(body)["error"]
    assert b"import " not in body and b"[project]" not in body and b"root:" not in body


def test_half_sent_body_gets_no_5xx(server: tuple[str, int]) -> None:
    reply = raw(server, post("/api/attention", b'{"text": "a', "Content-Length: 500"),
                close_after_send=True)
    assert status_of(reply) == 0 or 400 <= status_of(reply) < 500, reply[:200]


def test_bounded_load_mostly_hostile(server: tuple[str, int]) -> None:
    """100 requests from 8 threads, 60% hostile: no 5xx, hostile ones 4xx, valid ones the
    same answer as alone, and the server still answers quickly afterwards."""
    valid = post("/api/attention", b'{"text": "the cat sat"}')
    alone = raw(server, valid).partition(b"\r\n\r\n")[2]
    assert json.loads(alone)["tokens"]

    def one(n: int) -> str:
        if n % 5 < 2:
            reply = raw(server, valid)
            same = status_of(reply) == 200 and reply.partition(b"\r\n\r\n")[2] == alone
            return "ok" if same else f"valid request got {reply[:200]!r}"
        request, _ = HOSTILE[n % len(HOSTILE)]
        status = status_of(raw(server, request))
        return "4xx" if 400 <= status < 500 else f"hostile {request[:60]!r} got {status}"

    start = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, range(100)))
    assert sorted(set(results)) == ["4xx", "ok"], [r for r in results if r not in ("ok", "4xx")]
    assert results.count("ok") == 40 and time.monotonic() - start < 60
    t0 = time.monotonic()
    assert status_of(raw(server, valid)) == 200 and time.monotonic() - t0 < 5
