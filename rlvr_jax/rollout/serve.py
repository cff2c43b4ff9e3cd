"""`rlvr-serve --model PATH`: the policy behind JetStream's orchestrator + gRPC server and
an OpenAI-compatible HTTP endpoint (`/v1/completions`, `/v1/chat/completions`).

Both front ends share the model's params; each has its own decode slots (the gRPC side
runs JetStream's orchestrator over `make_engine`'s adapter, the HTTP side our scheduler
through a `RolloutStream`, which adds per-request sampling and log-probs). Both bind to
`--host` (loopback by default). A failed JetStream thread or engine stops the server with
exit status 1 and the error on stderr.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import signal
import socket
import sys
import threading
from pathlib import Path
from typing import Any

from rlvr_jax.rollout.sampling import SamplingParams


def build_parser() -> argparse.ArgumentParser:
    """The `rlvr-serve` command line."""
    p = argparse.ArgumentParser(prog="rlvr-serve", description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="local HF checkpoint directory")
    p.add_argument("--tokenizer", help="tokenizer directory (default: the model's)")
    p.add_argument("--model-name", help="id reported by /v1/models (default: directory name)")
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (default loopback)")
    p.add_argument("--http-port", type=int, default=8000, help="OpenAI HTTP port (0 = any)")
    p.add_argument("--grpc-port", type=int, default=9000, help="JetStream gRPC port (0 = any)")
    p.add_argument("--no-http", action="store_true", help="do not serve HTTP")
    p.add_argument("--no-grpc", action="store_true", help="do not serve JetStream gRPC")
    p.add_argument("--max-slots", type=int, default=8, help="decode slots per front end")
    p.add_argument("--max-len", type=int, default=2048, help="positions per slot")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--chunk", type=int, default=8, help="decode steps per engine call (HTTP)")
    p.add_argument("--temperature", type=float, default=1.0, help="gRPC sampling temperature")
    p.add_argument("--top-p", type=float, default=1.0, help="gRPC nucleus threshold")
    p.add_argument("--top-k", type=int, default=0, help="gRPC top-k (0 = off)")
    p.add_argument("--ready-file", help="write {http_port, grpc_port} here once serving")
    return p


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclasses.dataclass
class Servers:
    """What `start` started (filled in as it goes); `stop()` stops all of it."""

    http: Any = None
    stream: Any = None
    grpc: Any = None
    driver: Any = None
    """The JetStream orchestrator `Driver` behind the gRPC server."""
    grpc_port: int | None = None

    def stop(self) -> None:
        """Stops the front ends, then the engine threads."""
        if self.http is not None:
            self.http.stop()
        if self.stream is not None:
            self.stream.stop(timeout=30)
        if self.grpc is not None:
            self.grpc.stop()  # stops the driver too
        elif self.driver is not None:
            self.driver.stop()


def start(args: argparse.Namespace, servers: Servers) -> None:
    """Loads the model and starts the requested front ends, recording them in `servers`."""
    from rlvr_jax.models import load_pretrained

    model = load_pretrained(args.model, dtype=args.dtype)
    tokenizer_dir = args.tokenizer or args.model
    if not args.no_grpc:
        _start_grpc(model, tokenizer_dir, args, servers)
    if not args.no_http:
        servers.stream, servers.http = _start_http(model, tokenizer_dir, args)


def _start_grpc(model: Any, tokenizer_dir: str, args: argparse.Namespace, servers: Servers) -> None:
    """JetStream's interleaved-mode orchestrator over our engine, behind its gRPC server."""
    import grpc

    from rlvr_jax.rollout import jetstream_compat
    from rlvr_jax.rollout.jetstream_engine import make_engine

    lib = jetstream_compat.server_lib()
    engine = make_engine(
        model,
        max_slots=args.max_slots,
        max_len=args.max_len,
        tokenizer_path=tokenizer_dir,
        sampling=SamplingParams(args.temperature, args.top_p, args.top_k),
    )
    params = engine.load_params()
    servers.driver = jetstream_compat.orchestrator().Driver(
        prefill_engines=[engine],
        generate_engines=[engine],
        prefill_params=[params],
        generate_params=[params],
        interleaved_mode=True,
    )
    servers.grpc_port = args.grpc_port or _free_port(args.host)
    lib._HOST = args.host  # 0.2.2 hard-codes "[::]" (every interface) in this module global
    servers.grpc = lib.JetStreamServer(
        servers.driver,
        max(args.max_slots, 8),
        servers.grpc_port,
        grpc.insecure_server_credentials(),
    )
    servers.grpc.start()


def _start_http(model: Any, tokenizer_dir: str, args: argparse.Namespace) -> tuple[Any, Any]:
    from rlvr_jax.data.tokenizer import load_tokenizer
    from rlvr_jax.rollout.engine import EngineCore
    from rlvr_jax.rollout.openai_http import OpenAIServer
    from rlvr_jax.rollout.stream import RolloutStream

    tokenizer = load_tokenizer(tokenizer_dir)
    eos = [*model.config.eos_token_id]
    if tokenizer.eos_token_id is not None:
        eos.append(tokenizer.eos_token_id)
    stop_ids = tuple(dict.fromkeys(eos))
    core = EngineCore(model, max_slots=args.max_slots, max_len=args.max_len, chunk=args.chunk)
    stream = RolloutStream(core, max_new_tokens=16, stop_token_ids=stop_ids).start()
    http = OpenAIServer(
        stream,
        tokenizer,
        model_name=args.model_name or Path(args.model).resolve().name,
        stop_token_ids=stop_ids,
        host=args.host,
        port=args.http_port,
    ).start()
    return stream, http


def serve(args: argparse.Namespace, stop_event: threading.Event) -> int:
    """Serves until `stop_event` is set (0) or an engine thread fails (1)."""
    from rlvr_jax.rollout import jetstream_compat
    from rlvr_jax.rollout.stream import RolloutError

    failures: list[str] = []
    failed = threading.Event()
    servers = Servers()

    def on_error(thread: threading.Thread, error: BaseException) -> None:
        owner = jetstream_compat.owner_of(thread)
        if owner is not None and owner is servers.driver:  # not another server's thread
            failures.append(f"JetStream thread {thread.name} failed: {error!r}")
            failed.set()

    unregister = jetstream_compat.on_thread_error(on_error)
    try:
        start(args, servers)
        if args.ready_file:
            http_port = None if servers.http is None else servers.http.port
            ready = {"http_port": http_port, "grpc_port": servers.grpc_port}
            Path(args.ready_file).write_text(json.dumps(ready))
        print(f"rlvr-serve: serving ({describe(servers)})", file=sys.stderr, flush=True)
        while not stop_event.is_set() and not failed.is_set():
            stop_event.wait(0.5)
            if servers.stream is not None:
                try:
                    servers.stream.check()
                except RolloutError as e:
                    failures.append(str(e))
                    failed.set()
    finally:
        unregister()
        servers.stop()
    for message in failures:
        print(f"rlvr-serve: {message}", file=sys.stderr)
    return 1 if failures else 0


def describe(servers: Servers) -> str:
    """Where each front end listens, e.g. `http http://127.0.0.1:8000, grpc port 9000`."""
    http = "off" if servers.http is None else servers.http.url
    grpc = "off" if servers.grpc is None else f"port {servers.grpc_port}"
    return f"http {http}, grpc {grpc}"


def main(argv: list[str] | None = None) -> int:
    """`rlvr-serve` entry point: SIGINT/SIGTERM stop it cleanly."""
    args = build_parser().parse_args(argv)
    stop_event = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop_event.set())
    try:
        return serve(args, stop_event)
    except (OSError, ValueError) as e:  # unreadable checkpoint / tokenizer, port in use
        print(f"rlvr-serve: error: {e}", file=sys.stderr)
        return 2
