"""Table CDC's part of ``run`` (``--capture``): the start-up checks and the built parts.

Owns what the WAL composition root (app/run.py) and ``init`` add for captured tables: the
refusal of what ``--capture`` does not support yet (``check_capture``), expanding the
selection into tables, the problems to report (replica identity, SELECT), the publication
(inserts, updates and deletes of the captured tables) before the slot, and the capture
decoder and router the sessions use (docs/table-cdc.md; docs/design.md, the capture
room). Like run.py, it imports PostgreSQL-side modules inside its functions only.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cdc_relay import __version__
from cdc_relay.capture.decoder import CaptureDecoder, CodecOptions
from cdc_relay.capture.envelope import SourceInfo, TableCodec
from cdc_relay.capture.modes import TypeModes
from cdc_relay.capture.route import CaptureRouter
from cdc_relay.capture.selection import Selection, in_option_order
from cdc_relay.capture.shape import TableShape, identity_problem
from cdc_relay.capture.wal2json import Wal2JsonCaptureDecoder, capture_options
from cdc_relay.config import (
    REGISTRY_FORMATS,
    CaptureConfig,
    FlowConfig,
    ReplicationConfig,
    RouterConfig,
    TableRef,
)
from cdc_relay.errors import ConfigError

log = logging.getLogger("cdc_relay")

if TYPE_CHECKING:
    import psycopg

    from cdc_relay.pg.schema import Outcome
    from cdc_relay.routing import Router
    from cdc_relay.sink.base import SinkFactory
    from cdc_relay.wal.backfill.loop import BackfillStats
    from cdc_relay.wal.backfill.tables import TableSnapshot
    from cdc_relay.wal.stream.session import Decoder



SnapshotParts = tuple["Router", "SinkFactory", "FlowConfig", "BackfillStats"]


@dataclass(frozen=True, slots=True)
class CaptureSetup:
    """What the start-up checks found: the captured tables' shapes, by (schema, table), the
    problems to report (one line each, with the fix) and the publication's outcome."""

    shapes: dict[tuple[str, str], TableShape]
    problems: tuple[str, ...] = ()
    publication: Outcome | None = None  # None: not asked for
    signal: TableRef | None = None  # incremental snapshots' signal table (None: off)
    own: tuple[tuple[str, str], ...] = ()  # the outbox table relayed: no pattern captures it


def check_capture(capture: CaptureConfig, *, snapshot: str, other_sink: bool,
                  message_format: str) -> None:
    """ConfigError for what ``--capture`` does not support yet (docs/table-cdc.md), or a
    type mode Debezium does not have."""
    Selection.parse(capture.tables)
    type_modes(capture)
    refused = [(other_sink, "a sink other than Kafka"),
               (message_format.startswith("cloudevents"),
                "--message-format " + message_format)]
    for refuse, what in refused:
        if refuse:
            raise ConfigError(f"--capture cannot be combined with {what} yet "
                              "(docs/table-cdc.md, what is not supported yet)")


def prepare_capture(conn: psycopg.Connection[Any], tables_option: str, publication: str,
                    plugin: str, *, truncate: bool = False, signal: TableRef | None = None,
                    outbox: TableRef | None = None,
                    writer: psycopg.Connection[Any] | None = None) -> CaptureSetup:
    """The captured tables exist (ConfigError else), their problems are found (the caller
    reports them), and with pgoutput the publication publishes their changes (their
    truncates too with ``truncate``) - before the slot is made. With ``signal``, the
    incremental snapshots' signal table too (app/incremental.py; None in the setup when the
    role may not). wal2json needs no publication: the slot's options name the tables
    (capture/wal2json.py); it has no incremental snapshots (no signal table).

    Decoding on a standby (``conn`` the standby, ``writer`` the primary): all of it is
    done on the primary, then the standby's replay is awaited (pg/replay.py), so that the
    standby's catalog has what the primary has before its slot is made or used."""
    from cdc_relay.wal.slot.setup import ensure_capture_publication

    primary = writer or conn
    own = () if outbox is None else ((outbox.schema, outbox.name),)
    shapes, problems = capture_tables(primary, tables_option, plugin, own=own)
    outcome = None
    if plugin == "pgoutput":
        outcome = ensure_capture_publication(primary, publication, sorted(shapes),
                                             truncate=truncate)
    if signal is not None and outcome is not None:
        from cdc_relay.app.incremental import ensure_signal

        signal = signal if ensure_signal(primary, signal, publication) else None
    if writer is not None:
        from cdc_relay.pg.replay import wait_replayed

        wait_replayed(conn, writer, "the captured tables' publication")
    return CaptureSetup(shapes, problems, outcome, None if outcome is None else signal, own)


def capture_tables(conn: psycopg.Connection[Any], tables_option: str, plugin: str = "pgoutput",
                   own: tuple[tuple[str, str], ...] = ()
                   ) -> tuple[dict[tuple[str, str], TableShape], tuple[str, ...]]:
    """The shapes of the tables ``--capture`` names (ConfigError when one is missing or
    nothing matches) and their problems: a replica identity that makes UPDATE/DELETE fail,
    a role that may not SELECT them."""
    from cdc_relay.pg.catalog import expand, lacks_select, table_shape

    tables = expand(conn, Selection.parse(tables_option, own))
    if not tables:
        raise ConfigError(f"--capture {tables_option!r} matches no table: check the schema "
                          "name, or create the tables first")
    shapes: dict[tuple[str, str], TableShape] = {}
    problems: list[str] = []
    for schema, table in tables:
        shape = table_shape(conn, schema, table)
        assert shape is not None  # expand found it
        shapes[(schema, table)] = shape
        problem = identity_problem(shape, plugin)
        if problem:
            problems.append(problem)
        if lacks_select(conn, schema, table):
            problems.append(f"the role may not SELECT {shape.qualified} (snapshots need it). "
                            f"Fix: GRANT SELECT ON {shape.qualified} TO <the relay's role>")
    return shapes, tuple(problems)


def capture_decoder(outbox: Decoder, capture: CaptureConfig, router: RouterConfig, dsn: str,
                    setup: CaptureSetup) -> Decoder:
    """The capture decoder in front of the outbox's pgoutput or wal2json decoder."""
    from cdc_relay.decoding.pgoutput import PgOutputDecoder
    from cdc_relay.decoding.wal2json import Wal2JsonDecoder
    from cdc_relay.pg.catalog import CatalogLookup

    options = CodecOptions(capture.prefix, with_schemas(router.message_format),
                           capture.placeholder, capture.truncate, type_modes(capture),
                           (capture.schema_name_adjustment, capture.field_name_adjustment))
    catalog = CatalogLookup(dsn, setup.shapes)
    selection = Selection.parse(capture.tables, setup.own)
    if isinstance(outbox, Wal2JsonDecoder):
        return Wal2JsonCaptureDecoder(outbox, selection, catalog, options, catalog.types,
                                      catalog.positions)
    assert isinstance(outbox, PgOutputDecoder)
    signals = None if setup.signal is None else (setup.signal.schema, setup.signal.name)
    return CaptureDecoder(outbox, selection, catalog, options, catalog.types, signals=signals)


def wal2json_capture_options(capture: CaptureConfig, outbox: TableRef, setup: CaptureSetup, *,
                             partitioned: bool) -> list[tuple[str, str]]:
    """The wal2json options of a relay with ``--capture``: its ``add-tables`` names the
    outbox (unless ``--no-outbox``) and the captured tables."""
    return capture_options(outbox if capture.outbox else None, sorted(setup.shapes),
                           truncate=capture.truncate, partitioned=partitioned)


def type_modes(capture: CaptureConfig) -> TypeModes:
    """The captured tables' type modes (ConfigError for a value Debezium does not have)."""
    try:
        return TypeModes(capture.decimal_handling, capture.time_precision,
                         capture.interval_handling, capture.binary_handling,
                         capture.hstore_handling, capture.money_fraction_digits)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc


def with_schemas(message_format: str) -> bool:
    """Whether the codec writes JsonConverter's schema blocks: for ``debezium-json``, and for
    the registry formats, whose encoder (cdc_relay/sink/registry/captured.py) derives their
    schemas from them."""
    return message_format in ("debezium-json", *REGISTRY_FORMATS)


def make_capture_router(capture: CaptureConfig, dsn: str) -> CaptureRouter:
    """The router of captured rows (the source block's version, name and database)."""
    from cdc_relay.pg.db import dsn_database

    info = SourceInfo(f"cdc-relay-{__version__}", capture.prefix, dsn_database(dsn))
    return CaptureRouter(info, tombstones=capture.tombstones, clock_ns=time.time_ns)


def table_snapshot(capture: CaptureConfig, router_config: RouterConfig, dsn: str,
                   setup: CaptureSetup, parts: SnapshotParts,
                   counts: dict[tuple[str, str], int] | None = None) -> TableSnapshot:
    """``--snapshot initial``: the captured tables' snapshot, their codecs in the order
    Debezium snapshots them (``--capture``'s, as its ``table.include.list``); ``counts``:
    the relay's per-table event counts (RelayStats.captured), its ``r`` events added."""
    from cdc_relay.wal.backfill.tables import TableSnapshot

    schemas = with_schemas(router_config.message_format)
    modes = type_modes(capture)
    codecs = [TableCodec(setup.shapes[t], tuple(c.name for c in setup.shapes[t].columns),
                         capture.prefix, schemas, capture.placeholder, modes=modes,
                         names=(capture.schema_name_adjustment, capture.field_name_adjustment))
              for t in in_option_order(capture.tables, setup.shapes)]
    return TableSnapshot(codecs, make_capture_router(capture, dsn), *parts,
                         with_outbox=capture.outbox, counts={} if counts is None else counts)


def capture_snapshot(capture: CaptureConfig, router_config: RouterConfig,
                     repl: ReplicationConfig, parts: SnapshotParts,
                     counts: dict[tuple[str, str], int] | None = None,
                     signal: TableRef | None = None, outbox: TableRef | None = None
                     ) -> tuple[CaptureSetup, TableSnapshot]:
    """``--capture --snapshot initial``: the captured tables in the publication (before the
    cut-over may create the slot, which needs them there), their problems logged, and
    their snapshot's parts. Decoding on a standby: made on the primary (``prepare_capture``)."""
    from contextlib import nullcontext

    from cdc_relay.pg.db import connect

    with connect(repl.dsn, autocommit=True, application_name="cdc-relay") as conn, \
            (nullcontext() if repl.primary_dsn is None else
             connect(repl.primary_dsn, autocommit=True, application_name="cdc-relay")) as writer:
        setup = prepare_capture(conn, capture.tables, repl.publication, repl.plugin,
                                truncate=capture.truncate, signal=signal, outbox=outbox,
                                writer=writer)
    for problem in setup.problems:
        log.warning("%s", problem)
    return setup, table_snapshot(capture, router_config, repl.dsn, setup, parts, counts)
