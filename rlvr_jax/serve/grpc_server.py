"""JetStream's gRPC front end (`Orchestrator.Decode`, `Orchestrator.HealthCheck`) over our
engine, started and stopped within a bounded time.

JetStream 0.2.2's `JetStreamServer` binds every interface, runs on a non-daemon thread and its
`stop()` waits unboundedly for the driver. `JetStreamFrontEnd` serves the same servicer with
`grpc.aio` on `host:port` on a daemon thread, and stops within `driver_timeout + grace + 2` s.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import threading
from typing import Any

from rlvr_jax.rollout.backends import jetstream_compat

logger = logging.getLogger(__name__)


@dataclasses.dataclass(eq=False)
class JetStreamFrontEnd:
    """A started JetStream `driver` behind a gRPC server on `host:port` (0 = any); `stop`
    gives open RPCs `grace` s and the driver's threads `driver_timeout` s."""

    driver: Any
    _: dataclasses.KW_ONLY
    host: str
    port: int
    threads: int = 8
    grace: float = 1.0
    driver_timeout: float = 3.0

    def __post_init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread: threading.Thread | None = None
        self._server: Any = None
        self._executor = concurrent.futures.ThreadPoolExecutor(self.threads, "jetstream-rpc")

    def start(self) -> JetStreamFrontEnd:
        """Binds and serves; returns self. Raises OSError when the port cannot be bound."""
        import grpc
        from jetstream.core.proto import jetstream_pb2_grpc

        orchestrator = jetstream_compat.orchestrator()

        async def bind() -> None:
            # no SO_REUSEPORT (grpc's default): a port in use is an error, not shared
            self._server = grpc.aio.server(self._executor, options=[("grpc.so_reuseport", 0)])
            jetstream_pb2_grpc.add_OrchestratorServicer_to_server(
                orchestrator.LLMOrchestrator(driver=self.driver), self._server
            )
            port = self._server.add_insecure_port(f"{self.host}:{self.port}")
            if port == 0:
                raise OSError(f"cannot bind the gRPC port {self.host}:{self.port}")
            self.port = port
            await self._server.start()

        self._thread = threading.Thread(
            target=self._loop.run_forever, name="jetstream-grpc", daemon=True
        )
        self._thread.start()
        try:
            asyncio.run_coroutine_threadsafe(bind(), self._loop).result()
        except RuntimeError as e:  # grpc reports a failed bind as RuntimeError
            self._loop.call_soon_threadsafe(self._loop.stop)
            raise OSError(f"cannot serve gRPC on {self.host}:{self.port}: {e}") from e
        return self

    def stop(self) -> None:
        """Stops the driver's threads (bounded), then the gRPC server (open RPCs get
        `grace` seconds)."""
        stopper = threading.Thread(target=self.driver.stop, name="jetstream-stop", daemon=True)
        stopper.start()
        stopper.join(self.driver_timeout)
        if stopper.is_alive():
            alive = [t.name for t in self.driver._all_threads if t.is_alive()]
            logger.warning("JetStream driver threads still running after stop: %s", alive)
        if self._server is not None and self._loop.is_running():
            done = asyncio.run_coroutine_threadsafe(self._server.stop(self.grace), self._loop)
            try:
                done.result(timeout=self.grace + 2.0)
            except concurrent.futures.TimeoutError:
                logger.warning("the gRPC server did not stop within %.0f s", self.grace + 2)
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(2.0)
        self._executor.shutdown(wait=False, cancel_futures=True)
