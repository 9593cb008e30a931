"""Who the source is: the PostgreSQL system identifier (IDENTIFY_SYSTEM).

Exactly-once mode names its transactional.id and checkpoint after the system identifier
and the slot, so the identifier must come from the server the slot lives on. It owns
that one query on a short replication connection and nothing else.
"""

from __future__ import annotations

import psycopg

from cdc_relay.errors import DatabaseError, SourceLost, mask_secrets
from cdc_relay.pg.db import open_connection, replication_conninfo


def system_identifier(dsn: str) -> str:
    """The cluster's system identifier (as text); SourceLost/DatabaseError when unreachable."""
    try:
        with open_connection(replication_conninfo(dsn), autocommit=True) as conn:
            row = conn.execute("IDENTIFY_SYSTEM").fetchone()
    except psycopg.OperationalError as exc:
        raise SourceLost(f"cannot identify the PostgreSQL system: {mask_secrets(str(exc))}") from exc
    except psycopg.Error as exc:
        raise DatabaseError(f"IDENTIFY_SYSTEM failed: {mask_secrets(str(exc))} "
                            "(the user needs the REPLICATION attribute)") from exc
    if row is None:
        raise DatabaseError("IDENTIFY_SYSTEM returned nothing")
    return str(row[0])
