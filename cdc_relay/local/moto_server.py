"""A throwaway AWS-speaking server (moto's ``moto_server``: SQS, Kinesis) on 127.0.0.1, for tests.

Owns starting ``moto_server -H 127.0.0.1 -p PORT`` as a subprocess on a free port, waiting
until it answers, and stopping it (SIGTERM, then SIGKILL); its log goes to a temp file.
Everything is in memory: a restart loses every queue. moto's gaps that matter to the
relay are listed in docs/sinks.md (Amazon SQS and Amazon Kinesis, testing against moto).

Must not: touch a process it did not start, or import boto3 (callers bring their own client).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Self

from cdc_relay.errors import LocalServiceError
from cdc_relay.local.helpers import HOST, free_port, tail, wait_serving
from cdc_relay.local.registry import track, untrack

# What boto3 needs to talk to moto (any key is accepted; the region names the backend).
MOTO_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1"}


def moto_binary() -> str:
    """``moto_server`` next to this interpreter, else on PATH."""
    beside = Path(sys.executable).parent / "moto_server"
    if beside.is_file():
        return str(beside)
    found = shutil.which("moto_server")
    if found is None:
        raise LocalServiceError("moto_server is not installed: pip install 'moto[server]' "
                                "(part of cdc-relay[test])")
    return found


class MotoServer:
    """moto's server on 127.0.0.1:PORT; ``url`` is the endpoint for ``--brokers``."""

    def __init__(self, env: dict[str, str] | None = None, *, port: int | None = None) -> None:
        self._env = env or {}  # e.g. INITIAL_NO_AUTH_ACTION_COUNT=0: moto checks credentials
        self._given_port = port  # None: a free port is picked
        self.port = 0
        self._tmp: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def start(self, timeout: float = 30.0) -> Self:
        """Start the server and wait until it answers HTTP on a port of its own (another
        process may take a picked port before the bind: then a new port is picked)."""
        self._tmp = Path(tempfile.mkdtemp(prefix="cdc-relay-moto-"))
        track(self)
        log = self._tmp / "moto.log"
        for _ in range(5 if self._given_port is None else 1):
            self.port = self._given_port or free_port()
            with open(log, "ab") as out:
                self._proc = subprocess.Popen([moto_binary(), "-H", HOST, "-p", str(self.port)],
                                              stdout=out, stderr=subprocess.STDOUT,
                                              stdin=subprocess.DEVNULL, start_new_session=True,
                                              env={**os.environ, **self._env})
            try:
                if wait_serving(self._proc, self.port, self._answers, timeout):
                    return self
            except TimeoutError:
                self.stop()
                raise LocalServiceError(f"moto_server did not start on port {self.port}: "
                                        f"{tail(log)}") from None
            self._proc.kill()
            self._proc.wait(5)
        self.stop()
        if self._given_port is not None:
            raise LocalServiceError(f"moto_server could not listen on {HOST}:{self._given_port}: "
                                    "another process holds the port")
        raise LocalServiceError(f"moto_server could not get a port of its own: {tail(log)}")

    def _answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/moto-api/", timeout=1.0):
                return True
        except OSError:
            return False

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 5 s; remove the temp dir."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGCONT)  # in case it was paused
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        untrack(self)
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    def wait(self) -> int | None:
        """Block until the server process exits; its exit status, None when not running."""
        proc = self._proc
        return proc.wait() if proc is not None else None

    def pause(self) -> None:
        """SIGSTOP: requests hang until ``resume`` (a stalled endpoint)."""
        if self._proc is not None:
            self._proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self._proc is not None:
            self._proc.send_signal(signal.SIGCONT)

    def _emergency_stop(self) -> None:
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.kill()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
