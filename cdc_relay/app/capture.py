"""Table CDC's part of ``run`` (``--capture``): the start-up checks and the built parts.

Owns what the WAL composition root (app/run.py) adds for captured tables: expanding the
selection into tables, reporting their replica identity, the publication (inserts,
updates and deletes of the captured tables) before the slot, and the capture decoder and
router the sessions use (docs/table-cdc.md; docs/design.md, the capture room). Like
run.py, it imports PostgreSQL-side modules inside its functions only.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cdc_relay import __version__
from cdc_relay.capture.decoder import CaptureDecoder, CodecOptions
from cdc_relay.capture.envelope import SourceInfo
from cdc_relay.capture.route import CaptureRouter
from cdc_relay.capture.selection import Selection
from cdc_relay.capture.shape import TableShape
from cdc_relay.config import CaptureConfig, RouterConfig
from cdc_relay.errors import ConfigError

if TYPE_CHECKING:
    import psycopg

    from cdc_relay.wal.stream.session import Decoder

log = logging.getLogger("cdc_relay")


@dataclass(frozen=True, slots=True)
class CaptureSetup:
    """What the start-up checks found: the captured tables' shapes, by (schema, table)."""

    shapes: dict[tuple[str, str], TableShape]


def prepare_capture(conn: psycopg.Connection[Any], capture: CaptureConfig, publication: str,
                    plugin: str) -> CaptureSetup:
    """The captured tables exist (ConfigError else), their replica identity is reported, and
    the publication publishes their changes - before the slot is made."""
    from cdc_relay.pg.catalog import expand, identity_problem, lacks_select, table_shape
    from cdc_relay.wal.slot.setup import ensure_capture_publication

    if plugin != "pgoutput":
        raise ConfigError("--capture needs --plugin pgoutput for now (the slot uses "
                          f"{plugin}; docs/table-cdc.md)")
    tables = expand(conn, Selection.parse(capture.tables))
    if not tables:
        raise ConfigError(f"--capture {capture.tables!r} matches no table")
    shapes = {}
    for schema, table in tables:
        shape = table_shape(conn, schema, table)
        assert shape is not None  # expand found it
        shapes[(schema, table)] = shape
        problem = identity_problem(shape)
        if problem:
            log.warning("%s", problem, extra={"table": shape.qualified})
        if lacks_select(conn, schema, table):
            log.warning("the relay's role may not SELECT %s: GRANT SELECT ON %s TO <role>",
                        shape.qualified, shape.qualified)
    ensure_capture_publication(conn, publication, tables)
    return CaptureSetup(shapes)


def capture_decoder(outbox: Decoder, capture: CaptureConfig, router: RouterConfig, dsn: str,
                    setup: CaptureSetup) -> CaptureDecoder:
    """The capture decoder in front of the outbox's pgoutput decoder."""
    from cdc_relay.decoding.pgoutput import PgOutputDecoder
    from cdc_relay.pg.catalog import CatalogLookup

    assert isinstance(outbox, PgOutputDecoder)
    options = CodecOptions(capture.prefix, router.message_format == "debezium-json",
                           capture.placeholder)
    return CaptureDecoder(outbox, Selection.parse(capture.tables),
                          CatalogLookup(dsn, setup.shapes), options)


def make_capture_router(capture: CaptureConfig, dsn: str) -> CaptureRouter:
    """The router of captured rows (the source block's version, name and database)."""
    from cdc_relay.pg.db import dsn_database

    info = SourceInfo(f"cdc-relay-{__version__}", capture.prefix, dsn_database(dsn))
    return CaptureRouter(info, tombstones=capture.tombstones, clock_ns=time.time_ns)
