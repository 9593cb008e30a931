"""Throwaway RabbitMQ, NATS (JetStream) and Redis servers on free 127.0.0.1 ports, for tests and benchmarks.

Owns starting Debian's ``rabbitmq-server``, ``nats-server`` and ``redis-server`` as processes of the caller's
own: a temp dir each (data, logs, RabbitMQ's Erlang cookie), free ports, waiting until the
server itself answers, and stopping the whole process group (SIGTERM, then SIGKILL).
RabbitMQ gets an Erlang port mapper (``epmd``) of its own on a free port too, so nothing
machine-wide is started or left behind. The machines this project runs on start no
service (docs/development.md, "Test services"): whoever needs a broker starts one here.

Must not: touch a process it did not start, or import a broker client (callers bring
their own).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Self

from cdc_relay.errors import LocalServiceError
from cdc_relay.local.helpers import HOST, children, clean_env, free_port, listens_on, tail
from cdc_relay.local.registry import track, untrack

RABBITMQ_SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"  # Debian's, without the su wrapper
NATS_SERVER = "nats-server"
REDIS_SERVER = "redis-server"
_INSTALL = "apt-get install rabbitmq-server nats-server redis-server"


def listening(port: int, host: str = HOST, timeout: float = 0.5) -> bool:
    """Whether something accepts TCP connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _amqp_answers(port: int) -> bool:
    """Whether ``port`` speaks AMQP 0-9-1: a protocol header gets Connection.Start back."""
    try:
        with socket.create_connection((HOST, port), timeout=1.0) as sock:
            sock.sendall(b"AMQP\x00\x00\x09\x01")
            return sock.recv(1) == b"\x01"  # a method frame
    except OSError:
        return False


def _nats_answers(port: int) -> bool:
    """Whether ``port`` speaks NATS: the server greets with an INFO line."""
    try:
        with socket.create_connection((HOST, port), timeout=1.0) as sock:
            return sock.recv(5) == b"INFO "
    except OSError:
        return False


def _redis_answers(port: int) -> bool:
    """Whether ``port`` speaks RESP: PING gets +PONG (or -NOAUTH from a server with a password)."""
    try:
        with socket.create_connection((HOST, port), timeout=1.0) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(6) in (b"+PONG\r", b"-NOAUT")
    except OSError:
        return False


class _ServerProcess:
    """A server process (and its children) of our own, in a temp dir, on a picked port."""

    name = "the server"
    tmp_prefix = "cdc-relay-server-"

    def __init__(self) -> None:
        self.port = 0
        self._tmp: Path | None = None
        self._procs: list[subprocess.Popen[bytes]] = []

    def _spawn(self, tmp: Path, port: int) -> None:
        """Start the processes that serve on ``port`` (appending them to ``_procs``)."""
        raise NotImplementedError

    def _answers(self, port: int) -> bool:
        raise NotImplementedError

    @property
    def log_path(self) -> Path:
        if self._tmp is None:
            raise LocalServiceError(f"{self.name} was never started: call start()")
        return self._tmp / "server.log"

    @property
    def pid(self) -> int | None:
        return self._procs[-1].pid if self._procs else None

    def start(self, timeout: float = 60.0) -> Self:
        """Start and wait until the server answers on a port its own process holds; a port
        taken by another process before the bind is picked again."""
        if self._procs:
            return self
        if self._tmp is None:
            self._tmp = Path(tempfile.mkdtemp(prefix=self.tmp_prefix))
            track(self)
        for _ in range(5):
            self.port = free_port()
            self._spawn(self._tmp, self.port)
            if self._wait(timeout):
                return self
            self._kill_all()
        raise LocalServiceError(f"{self.name} could not get a port of its own; {self.log_path}:\n"
                                f"{tail(self.log_path)}")

    def _wait(self, timeout: float) -> bool:
        main = self._procs[-1]
        deadline = time.monotonic() + timeout
        while True:
            pids = [main.pid, *children(main.pid)]
            if any(listens_on(pid, self.port) for pid in pids) and self._answers(self.port):
                return True
            if main.poll() is not None:
                if listening(self.port):
                    return False  # someone else's server on our port
                self._kill_all()
                raise LocalServiceError(f"{self.name} exited at start-up; {self.log_path}:\n"
                                        f"{tail(self.log_path)}")
            if time.monotonic() > deadline:
                self._kill_all()
                raise LocalServiceError(f"{self.name} did not answer on {HOST}:{self.port} within "
                                        f"{timeout:g} s; {self.log_path}:\n{tail(self.log_path)}")
            time.sleep(0.05)

    def _popen(self, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        with open(self.log_path, "ab") as log:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, cwd=self._tmp,
                                    start_new_session=True, env=env)
        self._procs.append(proc)
        return proc

    def _signal_groups(self, sig: signal.Signals) -> None:
        for proc in self._procs:
            try:
                os.killpg(proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                continue

    def _kill_all(self, grace: float = 0.0) -> None:
        """SIGTERM the process groups (newest first), SIGKILL what is left after ``grace`` s."""
        if grace > 0:
            self._signal_groups(signal.SIGCONT)
            self._signal_groups(signal.SIGTERM)
            deadline = time.monotonic() + grace
            while any(proc.poll() is None for proc in self._procs) and time.monotonic() < deadline:
                time.sleep(0.05)
        self._signal_groups(signal.SIGKILL)
        for proc in self._procs:
            proc.wait(15)
        self._procs = []

    def stop(self) -> None:
        """Stop every process of the server and remove its temp dir."""
        self._kill_all(grace=10.0)
        untrack(self)
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    cleanup = stop

    def pause(self) -> None:
        """SIGSTOP every process of the server: connections stay open, nothing is answered."""
        self._signal_groups(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT what ``pause`` stopped."""
        self._signal_groups(signal.SIGCONT)

    def _emergency_stop(self) -> None:
        self._signal_groups(signal.SIGKILL)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def _require(binary: str, name: str) -> str:
    found = shutil.which(binary) or (binary if os.access(binary, os.X_OK) else None)
    if found is None:
        raise LocalServiceError(f"{name} is not installed ({binary} not found): {_INSTALL}")
    return found


class RabbitMqServer(_ServerProcess):
    """A RabbitMQ node of our own (guest/guest on 127.0.0.1); ``url`` is its AMQP URL."""

    name = "RabbitMQ"
    tmp_prefix = "cdc-relay-rabbitmq-"

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@{HOST}:{self.port}/%2F"

    def _spawn(self, tmp: Path, port: int) -> None:
        server = _require(RABBITMQ_SERVER, self.name)
        epmd_port, dist_port = free_port(), free_port()
        env = clean_env(HOME=str(tmp), ERL_EPMD_PORT=str(epmd_port))
        self._popen([_require("epmd", "Erlang's epmd"), "-port", str(epmd_port),
                     "-address", HOST], env)
        (tmp / "enabled_plugins").write_text("[].\n")
        env.update(
            RABBITMQ_NODENAME=f"cdc-relay-{port}@localhost", RABBITMQ_NODE_IP_ADDRESS=HOST,
            RABBITMQ_NODE_PORT=str(port), RABBITMQ_DIST_PORT=str(dist_port),
            RABBITMQ_MNESIA_BASE=str(tmp / "mnesia"), RABBITMQ_LOG_BASE=str(tmp / "log"),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(tmp / "enabled_plugins"),
            RABBITMQ_CONFIG_FILE=str(tmp / "rabbitmq"),
            RABBITMQ_ADVANCED_CONFIG_FILE=str(tmp / "advanced.config"),
            RABBITMQ_CONF_ENV_FILE=str(tmp / "rabbitmq-env.conf"),
            # Erlang distribution on loopback only, on the port picked for it.
            RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=(
                "-kernel inet_dist_use_interface {127,0,0,1} "
                f"-kernel inet_dist_listen_min {dist_port} -kernel inet_dist_listen_max {dist_port}"))
        self._popen([server], env)

    def _answers(self, port: int) -> bool:
        return _amqp_answers(port)


class NatsServer(_ServerProcess):
    """A NATS server with JetStream on (its store in the temp dir); ``url`` is its URL."""

    name = "NATS"
    tmp_prefix = "cdc-relay-nats-"

    @property
    def url(self) -> str:
        return f"nats://{HOST}:{self.port}"

    def _spawn(self, tmp: Path, port: int) -> None:
        self._popen([_require(NATS_SERVER, self.name), "-a", HOST, "-p", str(port), "-js",
                     "-sd", str(tmp / "jetstream")], clean_env())

    def _answers(self, port: int) -> bool:
        return _nats_answers(port)



class RedisServer(_ServerProcess):
    """A redis-server of our own: memory only (no RDB, no AOF), its dir the temp dir; ``url``
    is its address. ``password`` (optional) is required of every client (``requirepass``)."""

    name = "Redis"
    tmp_prefix = "cdc-relay-redis-"

    def __init__(self, password: str | None = None) -> None:
        super().__init__()
        self.password = password

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}{HOST}:{self.port}/0"

    def _spawn(self, tmp: Path, port: int) -> None:
        argv = [_require(REDIS_SERVER, self.name), "--port", str(port), "--bind", HOST,
                "--save", "", "--appendonly", "no", "--dir", str(tmp), "--daemonize", "no",
                "--protected-mode", "no"]
        if self.password:
            argv += ["--requirepass", self.password]
        self._popen(argv, clean_env())

    def _answers(self, port: int) -> bool:
        return _redis_answers(port)
