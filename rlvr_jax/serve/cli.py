"""`rlvr-serve --model PATH`: the policy behind JetStream's orchestrator + gRPC server and
an OpenAI-compatible HTTP endpoint (`/v1/completions`, `/v1/chat/completions`, streaming).

`--model` is an HF directory or a training checkpoint (`<output_dir>/checkpoints/<step>`,
exported first with its run's config: `training.export`). Slots hold `--max-len` positions,
by default the model's `max_position_embeddings` (more is refused); `/v1/models` lists the
served model and a request naming another gets OpenAI's 404 `model_not_found`.

Both front ends share the params, each with its own decode slots (gRPC: JetStream's
orchestrator over `make_engine`'s adapter; HTTP: our scheduler through a `RolloutStream`), bound
to `--host` (loopback by default). The model, tokenizers and HTTP stack are built on the main
thread before any server thread exists; then the servers start and the ready file is written.
SIGTERM / SIGINT exit 0 within 10 s in any state; a failed engine thread exits 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)
PROG = "rlvr-serve"


ENGINE_FLAGS = {
    "max_slots": "max_slots",
    "chunk": "decode_chunk",
    "kv_layout": "kv_layout",
    "page_size": "page_size",
    "kv_pages": "kv_pages",
    "kv_cache_gib": "kv_cache_gib",
    "prefill_chunk": "prefill_chunk",
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
}
"""Engine flags (argparse dest) -> the `rollout:` key they set; unset flags keep the
`--config` file's value, else `RolloutConfig`'s default (the one home of the defaults)."""


def build_parser() -> argparse.ArgumentParser:
    """The `rlvr-serve` command line."""
    from rlvr_jax.config.schema import RolloutConfig

    d = RolloutConfig()
    p = argparse.ArgumentParser(prog=PROG, description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument(
        "--model",
        required=True,
        help="local HF checkpoint directory, or a training checkpoint "
        "(<output_dir>/checkpoints/<step>: exported with its run's run_config.yaml)",
    )
    p.add_argument("--tokenizer", help="tokenizer directory (default: the model's)")
    p.add_argument(
        "--model-name",
        help="the model id /v1/models reports and requests must name (default: the directory's "
        "name; a checkpoint's: <run>-step<N>)",
    )
    p.add_argument(
        "--config",
        help="a YAML config whose `rollout:` section (the trainer's) sets the engine; "
        "the flags below override it",
    )
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (default loopback)")
    p.add_argument("--http-port", type=int, default=8000, help="OpenAI HTTP port (0 = any)")
    p.add_argument("--grpc-port", type=int, default=9000, help="JetStream gRPC port (0 = any)")
    p.add_argument("--no-http", action="store_true", help="do not serve HTTP")
    p.add_argument("--no-grpc", action="store_true", help="do not serve JetStream gRPC")
    p.add_argument(
        "--max-len",
        type=int,
        help="positions per slot, prompt + completion (default: the model's "
        "max_position_embeddings; more is refused)",
    )
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument(
        "--max-queue", type=int, default=1024, help="HTTP prompts waiting for slots (then 429)"
    )
    e = p.add_argument_group("engine (the config's rollout.* keys; defaults from rollout:)")
    e.add_argument("--max-slots", type=int, help=f"decode slots per front end ({d.max_slots})")
    e.add_argument("--chunk", type=int, help=f"decode steps per engine call ({d.decode_chunk})")
    e.add_argument("--kv-layout", choices=["paged", "contiguous"], help=f"({d.kv_layout})")
    e.add_argument("--page-size", type=int, help=f"tokens per KV page, paged ({d.page_size})")
    e.add_argument("--kv-pages", type=int, help="pages in the pool (default: slots × max-len)")
    e.add_argument("--kv-cache-gib", type=float, help="pool size in GiB (instead of --kv-pages)")
    e.add_argument(
        "--prefill-chunk", type=int, help=f"prompt tokens per prefill ({d.prefill_chunk})"
    )
    e.add_argument("--temperature", type=float, help=f"gRPC sampling temperature ({d.temperature})")
    e.add_argument("--top-p", type=float, help=f"gRPC nucleus threshold ({d.top_p})")
    e.add_argument("--top-k", type=int, help=f"gRPC top-k, 0 = off ({d.top_k})")
    p.add_argument("--ready-file", help="write {http_port, grpc_port, ready_s} here once serving")
    p.add_argument("--verbose", action="store_true", help="also show the libraries' INFO logs")
    return p


def rollout_config(args: argparse.Namespace) -> Any:
    """`--config`'s `rollout:` section (or the defaults) with the command line's engine flags
    (a budget flag replaces the file's); ValueError names an invalid key or two budgets."""
    from rlvr_jax.config.schema import RolloutConfig

    if args.kv_pages is not None and args.kv_cache_gib is not None:
        raise ValueError("give --kv-pages or --kv-cache-gib, not both")
    cfg = RolloutConfig()
    if args.config is not None:
        from rlvr_jax.config import load

        cfg = load(args.config, [f"model.path={json.dumps(args.model)}"]).rollout
    given = {key: getattr(args, dest) for dest, key in ENGINE_FLAGS.items()}
    given = {k: v for k, v in given.items() if v is not None}
    if "kv_pages" in given or "kv_cache_gib" in given:
        given = {"kv_pages": None, "kv_cache_gib": None, **given}
    return dataclasses.replace(cfg, **given)


@dataclasses.dataclass
class Servers:
    """What `start` started (filled in as it goes); `stop()` stops all of it."""

    http: Any = None
    stream: Any = None
    grpc: Any = None
    """The `JetStreamFrontEnd` (gRPC server over the orchestrator)."""
    driver: Any = None
    """The JetStream orchestrator `Driver` behind the gRPC server."""
    grpc_port: int | None = None

    def stop(self) -> None:
        """Stops the front ends, then the engines; each step is bounded (≈ 8 s in all)."""
        if self.http is not None:
            self.http.stop()
        if self.stream is not None:
            self.stream.stop(timeout=2.0)
        if self.grpc is not None:
            self.grpc.stop()  # stops the driver first
        elif self.driver is not None:
            self.driver.stop()


def start(args: argparse.Namespace, servers: Servers, stop: threading.Event) -> None:
    """Loads the model and starts the requested front ends, recording them in `servers`;
    returns early when `stop` is set."""
    from rlvr_jax.models import load_pretrained

    cfg = rollout_config(args)
    model = load_pretrained(args.model, dtype=args.dtype)
    args.max_len = max_len(args.max_len, model.config.max_position_embeddings)
    tokenizer_dir = args.tokenizer or args.model
    tokenizer = _load_tokenizer(tokenizer_dir)
    if not args.no_grpc and not stop.is_set():
        _start_grpc(model, tokenizer_dir, cfg, args, servers)
    if not args.no_http and not stop.is_set():
        servers.stream, servers.http = _start_http(model, tokenizer, cfg, args)


def max_len(asked: int | None, limit: int) -> int:
    """Positions per slot: `--max-len` (ValueError when over the model's `limit`), else the
    model's `max_position_embeddings`."""
    if asked is None:
        return limit
    if not 1 < asked <= limit:
        raise ValueError(
            f"--max-len {asked}: the model has max_position_embeddings={limit} (at most that)"
        )
    return asked


def served_name(model: str, given: str | None) -> str:
    """The id the server answers to: `--model-name`, else the directory's name (for a
    training checkpoint `<run>-step<N>`)."""
    from rlvr_jax.training.export import is_checkpoint

    if given:
        return given
    path = Path(model).resolve()
    return f"{path.parents[1].name}-step{path.name}" if is_checkpoint(path) else path.name


def _load_tokenizer(path: str) -> Any:
    """The HF tokenizer, exercised once here so that nothing it uses (transformers' lazy
    modules, the chat template's jinja2) is first imported by a server thread."""
    from rlvr_jax.data.tokenizer import apply_chat_template, load_tokenizer

    tokenizer = load_tokenizer(path)
    tokenizer.decode(tokenizer.encode("warm up"), skip_special_tokens=True)
    if tokenizer.chat_template:
        apply_chat_template(tokenizer, [{"role": "user", "content": "warm up"}])
    return tokenizer


def _start_grpc(
    model: Any, tokenizer_dir: str, cfg: Any, args: argparse.Namespace, servers: Servers
) -> None:
    """JetStream's interleaved-mode orchestrator over our engine, behind a gRPC server."""
    from rlvr_jax.rollout import engine_kwargs, sampling_params
    from rlvr_jax.rollout.backends import jetstream_compat
    from rlvr_jax.rollout.backends.jetstream import make_engine
    from rlvr_jax.serve.grpc_server import JetStreamFrontEnd

    engine = make_engine(
        model,
        max_slots=cfg.max_slots,
        max_len=args.max_len,
        tokenizer_path=tokenizer_dir,
        sampling=sampling_params(cfg),
        **engine_kwargs(cfg),
    )
    engine.build_tokenizer(engine.get_tokenizer())  # now, before the driver's threads
    params = engine.load_params()
    servers.driver = jetstream_compat.orchestrator().Driver(
        prefill_engines=[engine],
        generate_engines=[engine],
        prefill_params=[params],
        generate_params=[params],
        interleaved_mode=True,
    )
    servers.grpc = JetStreamFrontEnd(
        servers.driver, host=args.host, port=args.grpc_port, threads=max(cfg.max_slots, 8)
    ).start()
    servers.grpc_port = servers.grpc.port


def _start_http(model: Any, tokenizer: Any, cfg: Any, args: argparse.Namespace) -> tuple[Any, Any]:
    from rlvr_jax.rollout import build_rollout
    from rlvr_jax.serve.http import OpenAIServer

    stream = build_rollout(
        cfg,
        model,
        None,
        tokenizer,
        max_len=args.max_len,
        max_pending_groups=args.max_queue,
        compile_ahead=False,  # programs compile on first use: serving starts sooner
    ).start()
    try:
        http = OpenAIServer(
            stream,
            tokenizer,
            model_name=served_name(args.model, args.model_name),
            stop_token_ids=stream.stop_token_ids,
            host=args.host,
            port=args.http_port,
        ).start()
    except BaseException:
        stream.stop(timeout=2.0)
        raise
    return stream, http


def serve(
    args: argparse.Namespace,
    stop_event: threading.Event,
    on_ready: Callable[[], None] | None = None,
) -> int:
    """Serves until `stop_event` is set (0) or an engine thread fails (1); `on_ready` is
    called once both front ends serve."""
    from rlvr_jax.rollout.backends import jetstream_compat
    from rlvr_jax.rollout.stream import RolloutError

    t0 = time.monotonic()
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
        print(f"{PROG}: loading {args.model}", file=sys.stderr, flush=True)
        start(args, servers, stop_event)
        if on_ready is not None:
            on_ready()
        if not stop_event.is_set():
            ready_s = time.monotonic() - t0
            if args.ready_file:
                _write_ready(args.ready_file, servers, ready_s)
            print(
                f"{PROG}: serving ({describe(servers)}), ready in {ready_s:.1f} s",
                file=sys.stderr,
                flush=True,
            )
        while not stop_event.is_set() and not failed.is_set():
            stop_event.wait(0.2)
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
        print(f"{PROG}: {message}", file=sys.stderr, flush=True)
    return 1 if failures else 0


def _write_ready(path: str, servers: Servers, ready_s: float) -> None:
    """Writes the ready file atomically (a reader never sees it half written)."""
    http_port = None if servers.http is None else servers.http.port
    ready = {"http_port": http_port, "grpc_port": servers.grpc_port, "ready_s": round(ready_s, 2)}
    tmp = Path(f"{path}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(ready))
    tmp.replace(path)


def describe(servers: Servers) -> str:
    """Where each front end listens, e.g. `http http://127.0.0.1:8000, grpc port 9000`."""
    http = "off" if servers.http is None else servers.http.url
    grpc = "off" if servers.grpc is None else f"port {servers.grpc_port}"
    return f"http {http}, grpc {grpc}"


def main(argv: list[str] | None = None) -> int:
    """`rlvr-serve` entry point: SIGINT/SIGTERM stop it cleanly within 10 s."""
    from rlvr_jax.logs import setup_logging
    from rlvr_jax.shutdown import Interrupted, SignalStop
    from rlvr_jax.training.export import policy_directory

    parser = build_parser()
    args = parser.parse_args(argv)
    try:  # the engine settings are checked before anything is loaded
        rollout_config(args)
    except ValueError as e:
        parser.error(str(e))
    setup_logging(verbose=args.verbose)
    # a signal during start-up interrupts it (what was started is stopped on the way out);
    # once serving, it only sets the event the serving loop waits on
    signals = SignalStop(PROG, grace_s=8.0, raise_in_main=True).install()

    def serving() -> None:
        signals.raise_in_main = False

    try:
        args.model_name = served_name(args.model, args.model_name)
        with policy_directory(args.model) as (args.model, _):  # a checkpoint: its run's config
            rc = serve(args, signals.event, on_ready=serving)
    except Interrupted as e:
        print(f"{PROG}: stopped by {e} while starting", file=sys.stderr)
        rc = 0
    except (OSError, ValueError) as e:  # unreadable checkpoint / tokenizer, port in use, --max-len
        print(f"{PROG}: error: {e}", file=sys.stderr)
        rc = 2
    finally:
        signals.uninstall()
    return rc
