"""`attnlab serve CHECKPOINT`: the attention viewer and generation playground on a local port."""

from __future__ import annotations

import argparse
import errno
import logging
import signal
import socket
import sys
import threading
from typing import Any

from .common import (
    CLIError,
    add_checkpoint_argument,
    add_config_flags,
    add_device_flags,
    add_threads_flag,
    add_weights_flag,
    apply_threads,
    check_weights_flag,
    config_from_flags,
    count,
    load_model,
)
from .progress import Counter


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    from ..viewer.app import ServeConfig

    parser = subparsers.add_parser(
        "serve",
        help="web page to explore attention and stream generations",
        description="Serve the attention viewer for CHECKPOINT at http://HOST:PORT/.",
    )
    add_checkpoint_argument(parser)
    parser.add_argument(
        "--host", default="127.0.0.1",
        help="address to bind (default 127.0.0.1: this machine only; 0.0.0.0 exposes it)",
    )
    parser.add_argument("--port", type=int, default=8000, help="TCP port (default 8000)")
    add_weights_flag(parser)
    add_device_flags(parser)
    add_threads_flag(parser)
    add_config_flags(parser, ServeConfig, "request limits")
    return parser


def run(args: argparse.Namespace) -> int:
    from ..viewer.app import ServeConfig, create_app

    if not 1 <= args.port <= 65535:
        raise CLIError(f"--port {args.port} is not a TCP port; choose one in 1..65535")
    config = config_from_flags(args, ServeConfig)
    apply_threads(args, share=True)

    try:
        import uvicorn  # noqa: F401  (here: before the model loads, the message names the fix)
    except ImportError as err:
        raise ImportError(
            f"attnlab serve needs FastAPI and uvicorn ({err.name} is missing); "
            "install them with: pip install 'attnlab[serve]'"
        ) from err

    from ..model.decode import half_weights

    check_weights_flag(args)
    checkpoint = load_model(args)  # an attnlab checkpoint or a Hugging Face dir
    if args.weights == "float16":  # packed once, before the first request
        with Counter("tensor", "float16 packing", delay_s=2.0) as progress:
            half_weights(checkpoint.model, progress=progress)
    stopping = threading.Event()
    app = create_app(checkpoint.model, checkpoint.tokenizer, checkpoint.meta, config, stopping)
    c = checkpoint.model.config
    sock = _bind(args.host, args.port)  # before the banner: a port in use is one line
    print(
        f"attnlab serve: {args.checkpoint} ({count(c.n_layer, 'layer')} x "
        f"{count(c.n_head, 'head')}, "
        f"block_size {c.block_size}, {args.weights if args.weights != 'float32' else args.dtype}"
        f" weights on {checkpoint.model.wte.weight.device}) at "
        f"http://{args.host}:{args.port}/  (Ctrl-C stops)",
        file=sys.stderr,
    )
    _serve(app, sock, stopping)
    return 0


# seconds a stopping server waits for its answers to go out before it cuts them: a client that
# stopped reading holds its answer forever (uvicorn's default waits as long)
SHUTDOWN_GRACE = 3


def _serve(app: Any, sock: socket.socket, stopping: threading.Event) -> None:
    """Run uvicorn on `sock` until Ctrl-C or SIGTERM. The first signal sets `stopping`, so open
    generations end at their next token instead of running to max_new_tokens while uvicorn
    waits for them; uvicorn re-raises the signal once it has stopped, and SIGTERM, like
    SIGINT, then raises KeyboardInterrupt: `main` prints the one `interrupted` line (130)
    where SIGTERM's default would end the process without a word."""
    import uvicorn  # `run` checked that it is installed

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            stopping.set()
            super().handle_exit(sig, frame)

    # lifespan off: the app has no startup or shutdown work, and a second Ctrl-C (uvicorn's
    # forced exit) left the lifespan task to be cancelled, a traceback on the way out
    server = Server(uvicorn.Config(app, log_level="warning", lifespan="off",
                                   timeout_graceful_shutdown=SHUTDOWN_GRACE))
    logging.getLogger("uvicorn.error").addFilter(_not_cut_tasks)  # once: same function
    if threading.current_thread() is not threading.main_thread():  # no signals to handle
        server.run(sockets=[sock])
        return
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        server.run(sockets=[sock])
    finally:
        signal.signal(signal.SIGTERM, previous)


def _not_cut_tasks(record: logging.LogRecord) -> bool:
    """Leave out uvicorn's "Cancel N running task(s)" at the end of SHUTDOWN_GRACE: the clients
    cut stopped reading, no one to tell, and it would come before the one `interrupted` line."""
    return not str(record.msg).startswith("Cancel %s running task")


def _bind(host: str, port: int) -> socket.socket:
    """A socket bound to host:port for uvicorn, or a CLIError naming the port and the fix."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as err:
        raise CLIError(f"--host {host} is not an address here ({err.strerror})") from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does
    try:
        sock.bind(address)
    except OSError as err:
        sock.close()
        why = "is in use" if err.errno == errno.EADDRINUSE else f"cannot be bound ({err.strerror})"
        raise CLIError(f"port {port} on {host} {why}; pass --port N for another "
                       f"(e.g. --port {port + 1 if port < 65535 else 8000})") from None
    sock.set_inheritable(True)
    return sock
