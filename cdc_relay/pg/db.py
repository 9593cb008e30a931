"""The PostgreSQL edge shared by every module that talks SQL: connect, errors, names.

Owns three small things:

* ``connect``: open a psycopg connection and turn a failure into
  ``ServiceUnavailable("cannot connect to PostgreSQL at host:port/db: <reason>")``,
  never showing the password; a malformed DSN is a ``ConfigError``. ``borrowed_or_new``
  lets a check use a caller's connection or its own (the one borrow helper);
  ``replication_conninfo`` / ``plain_conninfo`` the DSN of a walsender / short
  connection with the relay's timeouts, keepalives and session settings.
* ``translate_error``: a psycopg error -> a RelayError whose message names the cause
  and the fix (wal_level, privileges, slot limits, a busy slot, ...), secrets masked.
* Identifier hygiene: deriving object names (indexes, views) that stay within
  PostgreSQL's 63-byte limit (the name checks are config.py's, re-exported here).

* ``password_provider``: the one place a rotating password (``--password-command``,
  ``--aws-rds-iam``: pg/credentials.py) reaches a connection. The command installs the
  provider app/credentials.py built from its configuration, for its whole run; every
  connection the relay opens - ``connect``, and ``open_connection`` for the callers that
  translate psycopg's errors themselves (the replication stream) - asks it for a password
  just before connecting. This is the module's one piece of state, process-wide by
  design: a connection opened anywhere, on any thread, cannot miss it.

It must not hold other state, run DDL or know the outbox's semantics: pg/schema.py applies the
migrations, the sources and helpers run their own statements. Every name that reaches
SQL is validated here *and* quoted with ``psycopg.sql.Identifier`` at the use site.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import errors as pgerrors
from psycopg import pq
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import TupleRow

# Re-exported: the checks live in config.py (pure), the application side's core uses them.
from cdc_relay.config import validated_columns as validated_columns
from cdc_relay.config import validated_table as validated_table
from cdc_relay.errors import (
    AccessRefused,
    ConfigError,
    DatabaseError,
    RelayError,
    ServiceUnavailable,
    SlotBusy,
    WrongEndpoint,
    mask_secrets,
)
from cdc_relay.pg.credentials import PasswordProvider, Target
from cdc_relay.text import one_line

# Only applied when neither the DSN, the caller nor PGCONNECT_TIMEOUT sets one: an
# unreachable host should fail a command in seconds, not hang on the OS's TCP timeout.
DEFAULT_CONNECT_TIMEOUT = 10

# Every connection notices a dead peer or a silent network (a half-open connection: no
# FIN, no RST) within ~30 s instead of waiting on the socket for ever: TCP keepalives
# while idle, and a bound on unacknowledged data while sending (docs/design.md,
# continuity). Each applies only where the DSN does not set it.
TCP_KEEPALIVES = {
    "keepalives": "1",
    "keepalives_idle": "10",
    "keepalives_interval": "5",
    "keepalives_count": "3",
    "tcp_user_timeout": "30000",
}

# The server's side of the same bounds, for a session whose backend must not outlive a
# silent network: the polling connection's claimed rows stay locked (SKIP LOCKED hides
# them from every other connection) until its backend notices the client is gone, which
# with the OS's defaults takes from 15 minutes to hours. Same units as pg_settings.
SERVER_TCP_KEEPALIVES = {
    "tcp_keepalives_idle": TCP_KEEPALIVES["keepalives_idle"],
    "tcp_keepalives_interval": TCP_KEEPALIVES["keepalives_interval"],
    "tcp_keepalives_count": TCP_KEEPALIVES["keepalives_count"],
    "tcp_user_timeout": TCP_KEEPALIVES["tcp_user_timeout"],
}

# Session settings for a walsender: plugins print values with the session's output
# functions, so pin what the decoders parse (timestamps in UTC, ISO style).
_SESSION_OPTIONS = "-c TimeZone=UTC -c DateStyle=ISO,YMD -c extra_float_digits=3"
# Detect a dead server or network instead of waiting forever on a silent socket.
_TCP_DEFAULTS = {"connect_timeout": "10", **TCP_KEEPALIVES}
# And the walsender the same on its side (before the user's options, which win): on a
# silent network it ends with the watchdog, instead of holding the slot "active" until
# wal_sender_timeout, which kept the reconnected relay out for another 30 s (measured).
_SERVER_KEEPALIVES = " ".join(f"-c {name}={value}" for name, value in SERVER_TCP_KEEPALIVES.items())

# What PostgreSQL says when it refuses the role rather than being unreachable: a retry
# cannot fix these (a connection failure carries no SQLSTATE, only the server's words).
_REFUSALS = (
    "password authentication failed",
    "no pg_hba.conf entry",
    "must be superuser or replication role",
    "must have the replication attribute",
    "is not permitted to log in",
    "permission denied",
    "authentication failed",
    "no password supplied",  # the server asks for one, the DSN has none (libpq's own words)
)
_ROLE_MISSING = re.compile(r'role "[^"]*" does not exist')

MAX_IDENTIFIER = 63  # NAMEDATALEN - 1; longer names are silently truncated by PostgreSQL

def describe_dsn(dsn: str) -> str:
    """``host:port/dbname`` of a DSN, for messages; never includes the password."""
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "<invalid DSN>"
    host = str(params.get("host") or params.get("hostaddr") or "local socket")
    port = str(params.get("port") or "5432")
    dbname = str(params.get("dbname") or params.get("user") or "default database")
    return f"{host}:{port}/{dbname}"


def dsn_database(dsn: str) -> str:
    """The database a DSN connects to, as libpq decides it: ``dbname``, else PGDATABASE,
    else the user name (the DSN's, PGUSER, else the OS user's)."""
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:
        raise ConfigError(f"invalid DSN: {_one_line(str(exc))}") from exc
    defaults = {option.keyword: option.val for option in pq.Conninfo.get_defaults()}
    for found in (params.get("dbname"), defaults.get(b"dbname"), params.get("user"),
                  defaults.get(b"user")):
        if found:
            return found.decode() if isinstance(found, bytes) else str(found)
    return "postgres"


def _connect_kwargs(dsn: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:
        raise ConfigError(f"invalid DSN: {_one_line(str(exc))}") from exc
    # PGCONNECT_TIMEOUT is read only to respect libpq's own variable.
    if not ({"connect_timeout"} & (params.keys() | kwargs.keys())) and (
        "PGCONNECT_TIMEOUT" not in os.environ
    ):
        kwargs = {**kwargs, "connect_timeout": DEFAULT_CONNECT_TIMEOUT}
    unset = {k: v for k, v in TCP_KEEPALIVES.items() if k not in params and k not in kwargs}
    return {**unset, **kwargs}


def refused(exc: BaseException) -> bool:
    """True when PostgreSQL refused the role (credentials, pg_hba, privileges), not unreachable."""
    state = getattr(exc, "sqlstate", None) or ""
    if state.startswith("28") or state == "42501":
        return True
    text = str(exc).lower()
    return any(marker in text for marker in _REFUSALS) or bool(_ROLE_MISSING.search(text))


def connect_failed(dsn: str, exc: psycopg.Error) -> RelayError:
    """A failed connection as the relay reports it: refused (exit 6), invalid, or unreachable."""
    if isinstance(exc, psycopg.ProgrammingError):  # e.g. an unknown option in kwargs
        return ConfigError(f"invalid connection settings: {_one_line(str(exc))}")
    if refused(exc):
        return AccessRefused(
            f"PostgreSQL at {describe_dsn(dsn)} refused the connection: {_connect_reason(exc)}. "
            "Fix the credentials (DSN, PGPASSFILE) or pg_hba.conf, or grant the role what it "
            "needs (docs/operations.md, least-privilege roles); retrying cannot fix this"
        )
    return ServiceUnavailable(
        f"cannot connect to PostgreSQL at {describe_dsn(dsn)}: {_connect_reason(exc)}"
    )


_provider: PasswordProvider | None = None


@contextmanager
def password_provider(provider: PasswordProvider | None) -> Iterator[None]:
    """Every connection opened inside asks ``provider`` for its password (None: the DSN's)."""
    global _provider
    previous, _provider = _provider, provider
    try:
        yield
    finally:
        _provider = previous


def connection_target(conninfo: str, kwargs: dict[str, Any] | None = None) -> Target:
    """The host, port and user a connection goes to, as libpq resolves them (defaults, PG*)."""
    params: dict[str, Any] = {**conninfo_to_dict(conninfo), **(kwargs or {})}
    defaults = {option.keyword.decode(): option.val.decode() if option.val else None
                for option in pq.Conninfo.get_defaults()}

    def first(key: str, fallback: str) -> str:
        value = params.get(key) or defaults.get(key) or fallback
        return str(value).split(",")[0].strip()  # a multi-host DSN: the first host

    port = first("port", "5432")
    return Target(host=first("host", "") or first("hostaddr", "localhost"),
                  port=int(port) if port.isdigit() else 5432, user=first("user", ""))


def open_connection(conninfo: str, **kwargs: Any) -> psycopg.Connection[TupleRow]:
    """``psycopg.Connection.connect`` with the installed password provider applied.

    psycopg's errors come out untranslated (the caller translates them); a provider that
    cannot give a password raises its own RelayError (AccessRefused, exit 6).
    """
    provider = _provider
    if provider is not None:
        kwargs = {**kwargs, "password": provider(connection_target(conninfo, kwargs))}
    return psycopg.Connection.connect(conninfo, **kwargs)


def connect(dsn: str, **kwargs: Any) -> psycopg.Connection[TupleRow]:
    """Open a psycopg connection; failures become ServiceUnavailable / ConfigError.

    ``kwargs`` go to ``psycopg.Connection.connect`` (``autocommit=True``,
    ``replication="database"``, ...).
    """
    kwargs = _connect_kwargs(dsn, kwargs)
    try:
        return open_connection(dsn, **kwargs)
    except psycopg.Error as exc:
        raise connect_failed(dsn, exc) from exc


@contextmanager
def borrowed_or_new(conninfo: str | psycopg.Connection[Any],
                    conn: psycopg.Connection[Any] | None = None) -> Iterator[psycopg.Connection[Any]]:
    """A connection to use: borrowed as is (its owner closes it) or new, closed on exit.

    The one borrow helper: ``conninfo`` is a DSN or an open connection, and ``conn`` a
    connection the caller may share (None: none). Lets a check run on the one connection
    a start-up shares, or on its own.
    """
    if isinstance(conninfo, psycopg.Connection):
        conn = conninfo
    if conn is not None:
        yield conn
        return
    assert isinstance(conninfo, str)
    with connect(conninfo, autocommit=True) as new:
        yield new


def replication_conninfo(dsn: str) -> str:
    """The user's DSN plus replication mode, pinned session settings and TCP keepalives."""
    params = conninfo_to_dict(dsn)
    options = " ".join(str(p) for p in (_SERVER_KEEPALIVES, params.get("options"), _SESSION_OPTIONS)
                       if p)
    extra = {k: v for k, v in _TCP_DEFAULTS.items() if k not in params}
    params.setdefault("application_name", "cdc-relay")
    return make_conninfo("", **{**params, **extra, "options": options, "replication": "database"})


def plain_conninfo(dsn: str) -> str:
    """The user's DSN for a short ordinary connection (same timeouts and keepalives as the stream)."""
    params = conninfo_to_dict(dsn)
    for key, value in _TCP_DEFAULTS.items():
        params.setdefault(key, value)
    params.setdefault("application_name", "cdc-relay")
    return make_conninfo("", **params)


_SERVER_PREFIX = re.compile(
    r'^(?:connection failed:\s*)?(?:connection to server (?:at|on) "[^"]*"'
    r"(?:\s*\([^)]*\))?,\s*port \d+ failed:\s*)?",
)


def _one_line(text: str) -> str:
    return mask_secrets(one_line(text))


def _connect_reason(exc: BaseException) -> str:
    text = _SERVER_PREFIX.sub("", str(exc).strip())
    return _one_line(text.replace("FATAL:", "")) or type(exc).__name__


_DENIED = re.compile(r"permission denied for (table|schema|relation|view|sequence) \"?([^\s\"]+)")
# What each mode needs on the outbox table (docs/operations.md, a least-privilege role).
DEFAULT_GRANT = "SELECT, UPDATE"


def privilege_fix(message: str, grant: str | None, role: str | None) -> str:
    """The GRANT that fixes a 42501 on a table or schema, for the connection's role."""
    role = role or "<the relay's role>"
    owner = re.search(r"must be owner of \w+ (\S+)", message)
    if owner is not None:
        return (f"run this as the owner of {owner.group(1)} (the role that ran init), or "
                f"ALTER TABLE {owner.group(1)} OWNER TO {role};")
    found = _DENIED.search(message)
    if found is None:
        return ("grant the relay's role what docs/operations.md (a least-privilege role) "
                "lists for its mode")
    kind, name = found.groups()
    if kind == "schema":
        return (f"GRANT USAGE ON SCHEMA {name} TO {role}; (init also needs CREATE on it: run "
                "init as the schema's owner)")
    if grant is None:
        return (f"GRANT {DEFAULT_GRANT} ON {name} TO {role}; (polling mode; WAL mode needs "
                "SELECT; cleanup DELETE; see docs/operations.md, a least-privilege role)")
    return f"GRANT {grant} ON {name} TO {role};"


def _role(conn: psycopg.Connection[Any] | None) -> str | None:
    try:
        return conn.info.user if conn is not None and not conn.closed else None
    except psycopg.Error:
        return None


def translate_error(exc: psycopg.Error, doing: str, *, grant: str | None = None,
                    conn: psycopg.Connection[Any] | None = None) -> RelayError:
    """Turn a psycopg error raised while ``doing`` into a RelayError that says the fix.

    ``doing`` completes "... while <doing>", e.g. ``"creating slot 'cdc_relay'"``.
    ``grant``: the table privileges the failing statement needs, for the GRANT a
    permission error (42501) names, to the role of ``conn``. Callers re-raise with
    ``raise translate_error(exc, ...) from exc``.
    """
    message = _one_line(exc.diag.message_primary or str(exc))
    state = exc.sqlstate
    if state is None or state.startswith("08"):
        return ServiceUnavailable(f"lost the PostgreSQL connection while {doing}: {message}")
    if state == "55006" or isinstance(exc, pgerrors.ObjectInUse):
        return SlotBusy(f"{message} (while {doing}): another process is using it")
    if "wal_level" in message:
        return DatabaseError(
            f"{message} (while {doing}). Fix: run ALTER SYSTEM SET wal_level = logical; "
            "then restart PostgreSQL (a reload is not enough)"
        )
    if state == "53400" or "replication slots are in use" in message:
        return DatabaseError(
            f"{message} (while {doing}). Fix: drop unused slots (see pg_replication_slots) "
            "or raise max_replication_slots and restart PostgreSQL"
        )
    if state == "55P03":
        return DatabaseError(
            f"{message} (while {doing}): a long-running transaction holds a lock on the "
            "table; retry when it has finished"
        )
    if state == "25006":  # read_only_sql_transaction
        return WrongEndpoint(
            f"{message} (while {doing}): the server is read-only (a hot standby or reader "
            "endpoint, or default_transaction_read_only = on). Fix: point --dsn at the "
            "primary (the writer endpoint)")
    if state == "42501":
        if "replication" in message.lower():
            return AccessRefused(
                f"{message} (while {doing}). Fix: ALTER ROLE <user> REPLICATION (or connect as "
                "a superuser; on RDS/Aurora: GRANT rds_replication TO <user>)"
            )
        return AccessRefused(
            f"permission denied while {doing}: {message}. Fix: "
            f"{privilege_fix(message, grant, _role(conn))}"
        )
    return DatabaseError(f"PostgreSQL error while {doing}: {message} (SQLSTATE {state})")


def derived_name(base: str, suffix: str) -> str:
    """``base + suffix``, shortened with a stable hash if it would exceed 63 bytes.

    PostgreSQL truncates long identifiers silently, so ``<63-char table>_dead_letters``
    would collide with the table itself; the hash keeps derived names distinct.
    """
    name = base + suffix
    if len(name) <= MAX_IDENTIFIER:
        return name
    digest = hashlib.sha1(base.encode(), usedforsecurity=False).hexdigest()[:8]
    return f"{base[: MAX_IDENTIFIER - len(suffix) - 9]}_{digest}{suffix}"
