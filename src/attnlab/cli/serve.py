"""`attnlab serve CHECKPOINT`: the attention viewer and generation playground on a local port."""

from __future__ import annotations

import argparse
import errno
import socket
import sys

from .common import (
    CLIError,
    add_checkpoint_argument,
    add_config_flags,
    add_device_flags,
    add_weights_flag,
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
    add_config_flags(parser, ServeConfig, "request limits")
    return parser


def run(args: argparse.Namespace) -> int:
    from ..viewer.app import ServeConfig, create_app

    if not 1 <= args.port <= 65535:
        raise CLIError(f"--port {args.port} is not a TCP port; choose one in 1..65535")
    config = config_from_flags(args, ServeConfig)

    try:
        import uvicorn
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
    app = create_app(checkpoint.model, checkpoint.tokenizer, checkpoint.meta, config)
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
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    server.run(sockets=[sock])
    return 0


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
