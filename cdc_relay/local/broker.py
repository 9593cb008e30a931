"""A throwaway memory-only Kafka-protocol broker (Tansu) for tests, the demo and benchmarks.

Owns: starting Tansu on a free 127.0.0.1 port, waiting until it answers a raw Kafka
ApiVersions request, and the fault knobs (stop, kill, restart, pause/resume). It tracks
itself in cdc_relay.local.registry so that it never outlives the interpreter.

Must not: touch a broker it did not start, or import the relay's drivers (no
confluent_kafka here). PostgreSQL is cdc_relay.local.postgres.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Self

from cdc_relay.errors import LocalServiceError
from cdc_relay.local.helpers import HOST, clean_env, free_port, kafka_api_versions_ok, tail, tansu_binary
from cdc_relay.local.registry import track, untrack


class Broker:
    """A memory-only Tansu broker on 127.0.0.1: a restart loses every topic."""

    def __init__(self, *, port: int | None = None) -> None:
        self._port = port
        self._proc: subprocess.Popen[bytes] | None = None
        self._tmp: Path | None = None
        self._paused = False

    @property
    def host(self) -> str:
        return HOST

    @property
    def port(self) -> int:
        if self._port is None:
            raise LocalServiceError("the broker has no port yet: call start()")
        return self._port

    @property
    def bootstrap(self) -> str:
        """``bootstrap.servers`` for clients: ``127.0.0.1:<port>``."""
        return f"{self.host}:{self.port}"

    @property
    def log_path(self) -> Path:
        if self._tmp is None:
            raise LocalServiceError("the broker was never started: call start()")
        return self._tmp / "tansu.log"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def start(self, timeout: float = 30.0) -> Self:
        """Start the broker and wait until it answers a Kafka ApiVersions request."""
        if self._proc is not None:
            return self
        binary = tansu_binary()
        if self._tmp is None:
            self._tmp = Path(tempfile.mkdtemp(prefix="cdc-relay-broker-"))
            track(self)
        if self._port is None:
            self._port = free_port()
        url = f"tcp://{self.host}:{self._port}"
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                [str(binary), "broker", "--listener-url", url, "--advertised-listener-url",
                 url, "--storage-engine", "memory://tansu/"], stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT, cwd=self._tmp, start_new_session=True,
                env=clean_env(RUST_LOG="warn"))
        deadline = time.monotonic() + timeout
        while not kafka_api_versions_ok(self.host, self._port):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise LocalServiceError(f"the Tansu broker did not start on {url}; "
                                        f"{self.log_path}:\n{tail(self.log_path)}")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 2 s (it waits ~5 s while clients are connected)."""
        if self._proc is None:
            return
        if not self._paused:
            self._proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(2.0)
        self.kill()

    def kill(self) -> None:
        """SIGKILL the broker (nothing is on disk, so nothing is lost that stop() keeps)."""
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait(15)
            self._proc = None
        self._paused = False

    def restart(self) -> None:
        """Kill and start again on the same port: every topic and producer id is gone."""
        self.kill()
        self.start()

    def pause(self) -> None:
        """SIGSTOP the broker: connections stay open, nothing is answered."""
        if self._proc is not None:
            self._proc.send_signal(signal.SIGSTOP)
            self._paused = True

    def resume(self) -> None:
        """SIGCONT what pause() stopped."""
        if self._proc is not None and self._paused:
            self._proc.send_signal(signal.SIGCONT)
        self._paused = False

    def cleanup(self) -> None:
        """Kill the broker and remove its temp dir."""
        self._emergency_stop()

    def _emergency_stop(self) -> None:
        with contextlib.suppress(Exception):
            self.kill()
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
        self._tmp = None
        untrack(self)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.cleanup()
