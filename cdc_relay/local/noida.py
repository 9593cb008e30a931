"""A throwaway Kafka-protocol broker with real transaction semantics (noida-db) for tests.

Owns: starting ``noida-db start --only kafka`` on a free 127.0.0.1 port with a data dir
of its own, waiting until it answers a raw Kafka ApiVersions request, and the fault knobs
(stop, kill, restart, pause/resume). Unlike the Tansu broker (cdc_relay.local.broker) it
hides aborted transactions from ``read_committed`` consumers and fences zombie producers,
so the exactly-once tests run on it (docs/design.md, test services). It persists to one
JSON file in its data dir: ``restart()`` keeps topics and transaction state, SIGKILL may
lose the latest writes, SIGINT stops it promptly (SIGTERM may wait). It tracks itself in
cdc_relay.local.registry so it never outlives the interpreter.

Must not: touch a broker it did not start, or import the relay's drivers.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Self

from cdc_relay.errors import LocalServiceError
from cdc_relay.local.helpers import HOST, clean_env, free_port, kafka_api_versions_ok, tail
from cdc_relay.local.registry import track, untrack


def noida_binary(package: str = "noida_db") -> Path:
    """The noida-db server binary shipped inside the ``noida-db`` wheel."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise LocalServiceError("noida-db is not installed: pip install 'cdc-relay[test]'")
    binary = Path(next(iter(spec.submodule_search_locations))) / "noida-db"
    if not binary.is_file():
        raise LocalServiceError(f"the noida-db binary is missing at {binary}: "
                                "pip install --force-reinstall noida-db")
    if not os.access(binary, os.X_OK):
        binary.chmod(0o755)  # the wheel's own launcher does the same
    return binary


class NoidaBroker:
    """noida-db's Kafka service on 127.0.0.1, its data in a temp dir of its own."""

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
            raise LocalServiceError("the noida-db broker has no port yet: call start()")
        return self._port

    @property
    def bootstrap(self) -> str:
        """``bootstrap.servers`` for clients: ``127.0.0.1:<port>``."""
        return f"{self.host}:{self.port}"

    @property
    def log_path(self) -> Path:
        if self._tmp is None:
            raise LocalServiceError("the noida-db broker was never started: call start()")
        return self._tmp / "noida.log"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def start(self, timeout: float = 30.0) -> Self:
        """Start the broker and wait until it answers a Kafka ApiVersions request."""
        if self._proc is not None:
            return self
        binary = noida_binary()
        if self._tmp is None:
            self._tmp = Path(tempfile.mkdtemp(prefix="cdc-relay-noida-"))
            track(self)
        if self._port is None:
            self._port = free_port()
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                [str(binary), "start", "--data-dir", str(self._tmp / "data"), "--host", self.host,
                 "--only", "kafka", "--kafka-port", str(self._port)], stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT, cwd=self._tmp, start_new_session=True,
                env=clean_env())
        deadline = time.monotonic() + timeout
        while not kafka_api_versions_ok(self.host, self._port):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise LocalServiceError(f"noida-db did not start on {self.bootstrap}; "
                                        f"{self.log_path}:\n{tail(self.log_path)}")
            time.sleep(0.02)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """SIGINT (saves its data and exits promptly), then SIGKILL after ``timeout`` s."""
        if self._proc is None:
            return
        self.resume()
        self._proc.send_signal(signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout)
        self.kill()

    def kill(self) -> None:
        """SIGKILL the broker: writes not yet saved to its data file may be lost."""
        if self._proc is not None:
            if self._paused:
                with contextlib.suppress(ProcessLookupError):
                    self._proc.send_signal(signal.SIGCONT)
            self._proc.kill()
            self._proc.wait(15)
            self._proc = None
        self._paused = False

    def restart(self) -> None:
        """Stop cleanly and start again on the same port and data dir (topics survive)."""
        self.stop()
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
