"""The wrong endpoint, said plainly: a pooler, a read-only node, a role without replication.

Owns recognising, and naming with the fix, the three ways a DSN reaches a server that
cannot do what the relay needs (docs/operations.md, the wrong endpoint):

* a connection pooler (pgbouncer) that cannot carry a replication connection: its
  refusal of the ``replication`` startup parameter (``pooler_refusal``), found by
  ``probe_replication``'s short walsender connection (IDENTIFY_SYSTEM; ``refuse_pooler``)
  before a slot is created, and by the stream when it connects;
* a read-only node where writes are needed - a hot standby (``pg_is_in_recovery()``),
  a reader endpoint, or ``default_transaction_read_only = on`` (``read_only_reason``,
  ``require_writable``);
* a hot standby named where ``run`` decodes without ``--primary-dsn``: the fix names both
  the primary and decoding on the standby (``standby_alternative``); ``require_standby``
  checks the other way round, that ``--dsn`` is a standby of PostgreSQL 16+ when it is
  given;
* a role without the right to replicate: ``replication_fix`` names both grants,
  ``ALTER ROLE … REPLICATION`` and RDS/Aurora's ``rds_replication`` membership (which
  doctor counts as the right: ops/doctor/gather.py reads it).

The first two are ``WrongEndpoint`` (exit 2: fix --dsn), one line; the third is
``AccessRefused`` (exit 6) where the refusal is met (pg/db.py, the stream, the slot).
Must not retry, create or change anything.
"""

from __future__ import annotations

from typing import Any

import psycopg

from cdc_relay.errors import WrongEndpoint, mask_secrets
from cdc_relay.pg.db import describe_dsn, open_connection, replication_conninfo, translate_error
from cdc_relay.text import one_line

# What PostgreSQL itself never says: pgbouncer's refusal of a startup parameter it does not
# know (``replication``, or the walsender's ``options``) in versions without replication
# support, and its own name in other refusals.
_POOLER_MARKERS = ("unsupported startup parameter", "pgbouncer")

POOLER_FIX = ("point --dsn at PostgreSQL itself (its host and port, e.g. 5432), not at the "
              "pooler: a logical replication stream needs a direct connection")

_READ_ONLY_SQL = ("SELECT pg_is_in_recovery(), current_setting('default_transaction_read_only'),"
                  " current_setting('transaction_read_only')")


def pooler_refusal(exc: BaseException) -> bool:
    """True when the error is a connection pooler refusing what only PostgreSQL can do."""
    text = str(exc).lower()
    return any(marker in text for marker in _POOLER_MARKERS)


def pooler_error(dsn: str, exc: BaseException) -> WrongEndpoint:
    """The one line for a pooler in --dsn."""
    said = mask_secrets(one_line(str(exc))).split("FATAL:")[-1].strip()
    return WrongEndpoint(
        f"{describe_dsn(dsn)} is a connection pooler (it answered: {said}), which cannot "
        f"carry a replication connection. Fix: {POOLER_FIX}")


def replication_fix(role: str | None) -> str:
    """How to give ``role`` the right to replicate, self-managed and on RDS/Aurora."""
    role = role or "<the relay's role>"
    return (f"ALTER ROLE {role} REPLICATION; as a superuser (on RDS/Aurora: GRANT "
            f"rds_replication TO {role}; as the master user)")


def probe_replication(dsn: str) -> psycopg.Error | None:
    """Open a replication connection and run IDENTIFY_SYSTEM; the error, or None if it works."""
    try:
        with open_connection(replication_conninfo(dsn), autocommit=True) as conn:
            conn.execute("IDENTIFY_SYSTEM")
    except psycopg.Error as exc:
        return exc
    return None


def refuse_pooler(dsn: str) -> None:
    """``WrongEndpoint`` when ``dsn`` reaches a pooler that cannot carry a replication connection.

    Run before a slot is created (init, a relay's first start), so that nothing is made
    through an endpoint that cannot stream from it. Any other failure of the probe is
    left to the step that needs the connection, which reports it with its own fix.
    """
    error = probe_replication(dsn)
    if error is not None and pooler_refusal(error):
        raise pooler_error(dsn, error) from error


def read_only_reason(conn: psycopg.Connection[Any]) -> str | None:
    """Why sessions on ``conn``'s server cannot write (None: they can)."""
    row = conn.execute(_READ_ONLY_SQL).fetchone()
    if row is None:
        return None
    in_recovery, default_read_only, read_only = row
    if in_recovery:
        return "a hot standby or reader endpoint (pg_is_in_recovery() is true)"
    if default_read_only == "on":
        return "read-only for this role or database (default_transaction_read_only = on)"
    if read_only == "on":
        return "read-only (transaction_read_only = on)"
    return None


STANDBY_ALTERNATIVE = ("; or, to decode on this standby (PostgreSQL 16+), keep --dsn and add "
                       "--primary-dsn naming its primary (docs/high-availability.md)")
# ``init`` writes only (the schema, the publication): on the primary, also when the relay
# decodes on a standby - the slot is created there by ``run --primary-dsn``.
INIT_STANDBY_ALTERNATIVE = ("; to decode on this standby (PostgreSQL 16+): cdc-relay init --dsn "
                            "PRIMARY --no-slot, then cdc-relay run --dsn STANDBY --primary-dsn "
                            "PRIMARY (docs/high-availability.md)")


def read_only_error(where: str, reason: str, doing: str, *, option: str = "--dsn",
                    standby_alternative: bool | str = False) -> WrongEndpoint:
    """The one line for a read-only server where ``doing`` must write.

    ``standby_alternative``: a hot standby is also named as a fix of its own (True:
    ``run``'s, decoding on a standby with ``--primary-dsn``; a string: that text).
    """
    fix = (f"point {option} at the primary (the cluster's writer endpoint), not a replica or "
           "reader endpoint")
    if standby_alternative and "pg_is_in_recovery" in reason:
        fix += (STANDBY_ALTERNATIVE if standby_alternative is True else str(standby_alternative))
    if "default_transaction_read_only" in reason:
        fix += (", or let the role write: ALTER ROLE <role> SET default_transaction_read_only "
                "= off")
    return WrongEndpoint(f"PostgreSQL at {where} is {reason}, but {doing} must write. Fix: {fix}")


def require_writable(conn: psycopg.Connection[Any], dsn: str, doing: str, *,
                     option: str = "--dsn", standby_alternative: bool | str = False) -> None:
    """``WrongEndpoint`` when ``conn``'s server cannot take ``doing``'s writes."""
    try:
        reason = read_only_reason(conn)
    except psycopg.Error as exc:
        raise translate_error(exc, "checking that the server accepts writes") from exc
    if reason is not None:
        raise read_only_error(describe_dsn(dsn), reason, doing, option=option,
                              standby_alternative=standby_alternative)


def require_standby(conn: psycopg.Connection[Any], dsn: str) -> None:
    """``WrongEndpoint`` unless ``conn`` is a hot standby that can decode (PostgreSQL 16+).

    With ``--primary-dsn``, ``--dsn`` must name the standby that holds the slot.
    """
    try:
        row = conn.execute("SELECT pg_is_in_recovery()").fetchone()
    except psycopg.Error as exc:
        raise translate_error(exc, "checking that --dsn is a standby") from exc
    if not (row and row[0]):
        raise WrongEndpoint(
            f"PostgreSQL at {describe_dsn(dsn)} is not a standby (pg_is_in_recovery() is "
            "false), but --primary-dsn says the relay decodes on a standby. Fix: point --dsn "
            "at the hot standby, or drop --primary-dsn to decode on this server")
    version = conn.info.server_version
    if version < 160000:
        raise WrongEndpoint(
            f"the standby at {describe_dsn(dsn)} runs PostgreSQL {version // 10000}, which "
            "cannot decode on a standby (16+ can). Fix: upgrade it to 16 or later, or point "
            "--dsn at the primary and drop --primary-dsn")
