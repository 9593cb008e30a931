"""The relay publishes what the SQLAlchemy, asyncpg and Django integrations wrote, as
CloudEvents the SDK reads, against real PostgreSQL and the real broker
(docs/application-side.md, docs/messages.md "CloudEvents")."""

from __future__ import annotations

import asyncio
from datetime import datetime

import asyncpg
import psycopg
import pytest
from cloudevents.v1.kafka import KafkaMessage, from_binary, from_structured
from psycopg.conninfo import conninfo_to_dict
from sqlalchemy import create_engine
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from cdc_relay.cloudevents import rfc3339
from cdc_relay.integrations import asyncpg as pg_async
from cdc_relay.integrations import sqlalchemy as sa_outbox
from cdc_relay.local.broker import Broker
from cdc_relay.outbox import emit
from tests.integration.appside_support import PAYLOAD, run_django, url
from tests.integration.wal_support import init_db, start_relay
from tests.support import CliProcess, KafkaCollector, Msg


def _write_with_every_integration(dsn: str) -> dict[str, str]:
    """One committed event per integration (and rolled-back ones); event id -> writer."""
    written: dict[str, str] = {}
    engine = create_engine(url(dsn, "psycopg"))
    with Session(engine) as session:
        sa_outbox.emit(session, "order", "gone", "RolledBack", {"n": 0})
        session.rollback()
    with Session(engine) as session, session.begin():
        written[str(sa_outbox.emit(session, "order", "o-1", "OrderCreated", PAYLOAD))] = "sqlalchemy"
    engine.dispose()
    p = conninfo_to_dict(dsn)

    async def async_writers() -> None:
        async_engine = create_async_engine(url(dsn, "asyncpg"))
        async with AsyncSession(async_engine) as session, session.begin():
            event_id = await sa_outbox.emit_async(session, "order", "o-2", "OrderPaid", [1, 2])
            written[str(event_id)] = "sqlalchemy async"
        await async_engine.dispose()
        conn = await asyncpg.connect(host=p["host"], port=int(p["port"]), user=p["user"],
                                     database=p["dbname"])
        async with conn.transaction():
            written[str(await pg_async.emit(conn, "invoice", "i-1", "InvoiceSent", "x"))] = "asyncpg"
        await conn.close()

    asyncio.run(async_writers())
    written[run_django(dsn)["id"]] = "django"
    return written


@pytest.mark.slow
def test_the_relay_publishes_what_each_integration_wrote_as_cloudevents(
        db: str, broker: Broker, topic_prefix: str) -> None:
    init_db(db, plugin="pgoutput")
    written = _write_with_every_integration(db)
    with start_relay(db, broker.bootstrap, topic_prefix, plugin="pgoutput",
                     extra=("--message-format", "cloudevents")) as relay, \
            KafkaCollector(broker.bootstrap, topic_prefix) as collector:
        with psycopg.connect(db) as conn:  # written last: a rolled-back event would be older
            sentinel = str(emit(conn, "order", "end", "Sentinel", {}))
        wanted = {*written, sentinel}  # on several topics: no order among them to wait on
        collector.collect(until=lambda ms: wanted <= {m.headers["id"].decode() for m in ms},
                          timeout=60)
        messages = collector.collect(timeout=1.0)  # a rolled-back event would show up here
        assert relay.stop() == 0, relay.stderr
    events = {m.headers["id"].decode(): from_binary(KafkaMessage(m.headers, m.key, m.value))
              for m in messages}
    assert set(events) == {*written, sentinel}  # nothing rolled back, nothing lost
    with psycopg.connect(db, autocommit=True) as conn:
        stored = {str(row[0]): row[1:] for row in conn.execute(
            "SELECT id, aggregate_id, event_type, payload, (extract(epoch FROM created_at)"
            " * 1000)::bigint FROM outbox_events")}
    source = f"/cdc-relay/{conninfo_to_dict(db)['dbname']}/public.outbox_events"
    for event_id, cloud in events.items():
        aggregate_id, event_type, payload, created_ms = stored[event_id]
        assert (cloud["id"], cloud["type"], cloud["subject"], cloud["source"]) == (
            event_id, event_type, aggregate_id, source)
        assert cloud.data == payload
        assert abs(_epoch_ms(cloud["time"]) - created_ms) <= 1  # RFC 3339, to the millisecond
        assert cloud["time"] == rfc3339(_epoch_ms(cloud["time"]))


def _epoch_ms(text: str) -> int:
    return round(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


def _by_id(messages: list[Msg]) -> dict[str, Msg]:
    return {m.headers["id"].decode(): m for m in messages}


@pytest.mark.slow
def test_structured_cloudevents_are_identical_compiled_pure_python_and_polled(
        db: str, broker: Broker, topic_prefix: str) -> None:
    init_db(db, slot="c", plugin="pgoutput")
    init_db(db, slot="p", plugin="pgoutput")
    with psycopg.connect(db) as conn:
        wanted = {str(emit(conn, "order", f"o-{n}", "OrderCreated", {"n": n, "note": "grüße"}))
                  for n in range(3)}
    shaping = ("--message-format", "cloudevents-structured", "--cloudevents-source", "urn:{table}")
    results = {}
    for slot, extra in (("c", ()), ("p", ("--pure-python",))):
        with start_relay(db, broker.bootstrap, topic_prefix + slot, slot=slot, plugin="pgoutput",
                         extra=(*shaping, *extra)) as relay, \
                KafkaCollector(broker.bootstrap, topic_prefix + slot) as collector:
            results[slot] = _by_id(collector.collect(until=lambda ms: wanted <= set(_by_id(ms)),
                                                     timeout=60))
            assert relay.stop() == 0, relay.stderr
    with CliProcess(["poll", "--dsn", db, "--brokers", broker.bootstrap, "--topic-pattern",
                     f"{topic_prefix}q.{{aggregate_type}}", "--interval", "200ms",
                     *shaping]) as poller, \
            KafkaCollector(broker.bootstrap, f"{topic_prefix}q") as collector:
        results["q"] = _by_id(collector.collect(until=lambda ms: wanted <= set(_by_id(ms)),
                                                timeout=60))
        assert poller.stop() == 0, poller.stderr
    for event_id in wanted:
        compiled, pure, polled = (results[name][event_id] for name in ("c", "p", "q"))
        assert (compiled.key, compiled.value, compiled.headers) == (
            pure.key, pure.value, pure.headers) == (polled.key, polled.value, polled.headers)
        cloud = from_structured(KafkaMessage(compiled.headers, compiled.key, compiled.value))
        assert (cloud["id"], cloud["type"], cloud["source"]) == (event_id, "OrderCreated",
                                                                  "urn:outbox_events")
        assert cloud.data["note"] == "grüße"
        assert compiled.headers["content-type"] == b"application/cloudevents+json"
