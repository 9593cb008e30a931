"""A throwaway pgbouncer in front of a PostgreSQL server: the pooler a DSN must not point at.

Owns writing its ini and userlist in a temp dir, running ``pgbouncer`` (Debian's
``/usr/sbin/pgbouncer``, or ``PGBOUNCER``'s path given by the caller) on a free
127.0.0.1 port as the ``postgres`` user when we are root (pgbouncer refuses root), and
stopping it by its own PID. Every database name is forwarded to the upstream server
(``* = host=... port=...``), with trust authentication for the users listed.

Used by the tests that show the relay naming a pooler as the wrong endpoint
(docs/operations.md). Must not touch the upstream server or any other pgbouncer
(never the system's service).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import socket
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Self

from cdc_relay.errors import LocalServiceError
from cdc_relay.local.helpers import HOST, OwnedServer, free_port, tail, wait_serving

DEFAULT_BINARY = "/usr/sbin/pgbouncer"


class Pgbouncer(OwnedServer):
    """pgbouncer forwarding every database to ``upstream_host:upstream_port``."""

    def __init__(self, upstream_port: int, *, upstream_host: str = HOST,
                 users: Sequence[str] = ("postgres",), pool_mode: str = "session",
                 binary: str = DEFAULT_BINARY) -> None:
        self._upstream = (upstream_host, upstream_port)
        self._users = tuple(users)
        self._pool_mode = pool_mode
        self._binary = binary
        self._tmp: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self.port = 0

    def dsn(self, dbname: str = "postgres", user: str = "postgres") -> str:
        """A key=value connection string for ``dbname`` through the pooler."""
        return f"host={HOST} port={self.port} dbname={dbname} user={user}"

    def start(self) -> Self:
        if not os.access(self._binary, os.X_OK):
            raise LocalServiceError(f"pgbouncer not found at {self._binary}: "
                                    "apt-get install pgbouncer")
        self._tmp = Path(tempfile.mkdtemp(prefix="cdc-relay-pgbouncer-"))
        self.port = free_port()
        host, port = self._upstream
        ini = self._tmp / "pgbouncer.ini"
        ini.write_text(
            "[databases]\n"
            f"* = host={host} port={port}\n"
            "[pgbouncer]\n"
            f"listen_addr = {HOST}\n"
            f"listen_port = {self.port}\n"
            "unix_socket_dir =\n"
            "auth_type = trust\n"
            f"auth_file = {self._tmp / 'userlist.txt'}\n"
            f"pool_mode = {self._pool_mode}\n"
            f"logfile = {self._tmp / 'pgbouncer.log'}\n"
            "ignore_startup_parameters = extra_float_digits,options\n",
            encoding="utf-8")
        (self._tmp / "userlist.txt").write_text(
            "".join(f'"{user}" ""\n' for user in self._users), encoding="utf-8")
        command = [self._binary, str(ini)]
        if os.geteuid() == 0:  # pgbouncer refuses to run as root
            account = pwd.getpwnam("postgres")
            for path in (self._tmp, *self._tmp.iterdir()):
                os.chown(path, account.pw_uid, account.pw_gid)
            command = [self._binary, "-u", "postgres", str(ini)]
        self._proc = subprocess.Popen(command, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
        try:
            if not wait_serving(self._proc, self.port, self._answers, timeout=20):
                raise LocalServiceError(f"another process took port {self.port}")
        except (TimeoutError, LocalServiceError) as exc:
            log = tail(self._tmp / "pgbouncer.log")
            self.stop()
            raise LocalServiceError(f"pgbouncer did not start ({exc}):\n{log}") from exc
        return self

    def _answers(self) -> bool:
        with contextlib.suppress(OSError), socket.create_connection((HOST, self.port), 0.5):
            return True
        return False
