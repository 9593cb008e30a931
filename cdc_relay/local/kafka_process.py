"""What every throwaway Kafka-protocol broker process here has in common.

Owns one broker process on 127.0.0.1: a free port, a temp dir of its own (log, data),
starting it and waiting until it answers a raw Kafka ApiVersions request, and the fault
knobs every test uses (kill, pause/resume, cleanup), tracked in cdc_relay.local.registry
so it never outlives the interpreter. Subclasses say which binary runs with which
arguments, and how the broker stops and restarts (local/broker.py: Tansu, memory-only;
local/apache_kafka.py: Apache Kafka itself, the broker of record for Kafka's semantics).

Must not: touch a process it did not start, or import the relay's drivers.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType
from typing import Self

from cdc_relay.errors import LocalServiceError
from cdc_relay.local.helpers import (
    HOST,
    free_port,
    kafka_api_versions_ok,
    tail,
    wait_serving,
    wait_stopped,
)
from cdc_relay.local.registry import track, untrack


class KafkaProcess:
    """One broker process on 127.0.0.1 with a temp dir; subclasses define ``_command``."""

    name = "the broker"  # for messages
    log_name = "broker.log"
    tmp_prefix = "cdc-relay-broker-"

    def __init__(self, *, port: int | None = None) -> None:
        self._port = port
        self._proc: subprocess.Popen[bytes] | None = None
        self._tmp: Path | None = None
        self._paused = False

    # -- what a subclass says ---------------------------------------------------
    def _command(self, tmp: Path, port: int) -> tuple[list[str], dict[str, str]]:
        """(argv, environment) that run the broker on ``port`` with ``tmp`` as its dir."""
        raise NotImplementedError

    # -- addresses ----------------------------------------------------------------
    @property
    def host(self) -> str:
        return HOST

    @property
    def port(self) -> int:
        if self._port is None:
            raise LocalServiceError(f"{self.name} has no port yet: call start()")
        return self._port

    @property
    def bootstrap(self) -> str:
        """``bootstrap.servers`` for clients: ``127.0.0.1:<port>``."""
        return f"{self.host}:{self.port}"

    @property
    def log_path(self) -> Path:
        if self._tmp is None:
            raise LocalServiceError(f"{self.name} was never started: call start()")
        return self._tmp / self.log_name

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    # -- lifecycle ----------------------------------------------------------------
    def start(self, timeout: float = 30.0) -> Self:
        """Start the broker and wait until it answers a Kafka ApiVersions request itself.

        A port picked here can be taken by another process between ``free_port`` and the
        broker's bind (parallel test workers pick ports too): then the answer comes from the
        other broker and ours exits. That is noticed (``listens_on``) and a port picked here
        is picked again; a port given by the caller is an error.
        """
        if self._proc is not None:
            return self
        if self._tmp is None:
            self._tmp = Path(tempfile.mkdtemp(prefix=self.tmp_prefix))
            track(self)
        picked = self._port is None
        for _ in range(5):
            if self._port is None:
                self._port = free_port()
            if self._spawn(self._tmp, self._port, timeout):
                return self
            if not picked:
                break
            self._port = None
        raise LocalServiceError(f"{self.name} could not listen on 127.0.0.1:{self._port}: "
                                f"another process holds the port; {self.log_path}:\n"
                                f"{tail(self.log_path)}")

    def _spawn(self, tmp: Path, port: int, timeout: float) -> bool:
        """Run the broker on ``port``: True once it answers there itself, False if it lost
        the port to another process (it exited or never listened), raising if it failed."""
        argv, env = self._command(tmp, port)
        with open(self.log_path, "ab") as log:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, cwd=tmp,
                                    start_new_session=True, env=env)
        self._proc = proc
        try:
            if wait_serving(proc, port, lambda: kafka_api_versions_ok(self.host, port), timeout):
                return True
        except TimeoutError:
            self.kill()
            raise LocalServiceError(f"{self.name} did not start on {self.bootstrap}; "
                                    f"{self.log_path}:\n{tail(self.log_path)}") from None
        self.kill()
        return False

    def wait(self) -> int | None:
        """Block until the broker process exits (killed, crashed); its exit status, None
        when it was not running."""
        proc = self._proc
        return proc.wait() if proc is not None else None

    def _stop_with(self, sig: signal.Signals, timeout: float) -> None:
        """Send ``sig`` (after resuming a paused broker), wait ``timeout`` s, then SIGKILL."""
        if self._proc is None:
            return
        self.resume()
        self._proc.send_signal(sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout)
        self.kill()

    def kill(self) -> None:
        """SIGKILL the broker."""
        if self._proc is not None:
            if self._paused:
                with contextlib.suppress(ProcessLookupError):
                    self._proc.send_signal(signal.SIGCONT)
            self._proc.kill()
            self._proc.wait(15)
            self._proc = None
        self._paused = False

    def pause(self) -> None:
        """SIGSTOP the broker: connections stay open, nothing is answered. Returns once
        every thread of it is stopped (a signal takes effect asynchronously)."""
        if self._proc is not None:
            self._proc.send_signal(signal.SIGSTOP)
            self._paused = True
            wait_stopped(self._proc.pid)

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
