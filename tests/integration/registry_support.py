"""The registry formats' references: a second relay writing the same changes as JSON on a
slot of its own, and Debezium embedded (tests/integration/debezium_child.py) with a
converter, whose subjects are compared with the relay's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
from confluent_kafka.schema_registry import SchemaRegistryClient
from psycopg.conninfo import conninfo_to_dict

from cdc_relay.local.apache_kafka import ApacheKafka
from cdc_relay.local.apicurio import ApicurioRegistry
from tests.integration.wal_support import init_db, start_relay
from tests.support import KafkaCollector, Msg


def side_by_side(db: str, broker: ApacheKafka, topic_prefix: str, ours: tuple[str, ...],
                 reference: tuple[str, ...], changes: tuple[str, ...], topics: tuple[str, str],
                 count: int) -> tuple[list[Msg], list[Msg]]:
    """Two relays (``ours``' and ``reference``'s extra options, the second on slot
    ``cdc_plain``) over ``changes``: the first ``count`` messages of each of ``topics``."""
    init_db(db, slot="cdc_plain", plugin="pgoutput")
    relay = start_relay(db, broker.bootstrap, topic_prefix, plugin="pgoutput", extra=ours)
    plain = start_relay(db, broker.bootstrap, topic_prefix, plugin="pgoutput", slot="cdc_plain",
                        extra=reference)
    try:
        with psycopg.connect(db, autocommit=True) as conn:
            for change in changes:
                conn.execute(change)
        with KafkaCollector(broker.bootstrap, topic_prefix) as collector:
            got = collector.collect(until=lambda ms: all(
                len([m for m in ms if m.topic == t]) >= count for t in topics), timeout=90)
        assert relay.running() and plain.running(), relay.stderr + plain.stderr
    finally:
        assert relay.stop() == 0, relay.stderr
        assert plain.stop() == 0, plain.stderr
    return ([m for m in got if m.topic == topics[0]][:count],
            [m for m in got if m.topic == topics[1]][:count])


def prepare_debezium(db: str, table_ddl: str, table: str = "public.items") -> None:
    """Debezium embedded can run (else skip, or fail in CI); the relay's slot, ``table``
    made, Debezium's publication ``dbz_pub`` and slot ``dbz`` made before any change."""
    from benchmarks.debezium import unavailable
    from tests.support import skip_or_fail_in_ci

    why = unavailable()
    if why is not None:
        skip_or_fail_in_ci(f"Debezium embedded cannot run here: {why}")
    init_db(db, plugin="pgoutput")
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute(table_ddl)
        conn.execute(f"CREATE PUBLICATION dbz_pub FOR TABLE {table}")
        conn.execute("SELECT pg_create_logical_replication_slot('dbz', 'pgoutput')")


def debezium_records(db: str, prefix: str, registry: ApicurioRegistry, out: Path, count: int,
                     *converter: str, tables: str = "public.items",
                     properties: dict[str, str] | None = None) -> list[Any]:
    """[topic, key hex, value hex] of the first ``count`` records Debezium embedded writes
    from slot ``dbz`` and publication ``dbz_pub`` with ``converter`` (default: Avro)."""
    info = conninfo_to_dict(db)
    env = dict(os.environ, DBZ_EXTRA=json.dumps(properties or {}))
    subprocess.run([sys.executable, "-m", "tests.integration.debezium_child", str(info["host"]),
                    str(info["port"]), str(info["dbname"]), "dbz", "dbz_pub", prefix, tables,
                    str(count), str(out), "no_data", registry.ccompat_url, *converter],
                   check=True, timeout=300, capture_output=True, stdin=subprocess.DEVNULL, env=env)
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == count, records
    return records


def assert_same_subjects(registry: ApicurioRegistry, mine: tuple[str, str], theirs: tuple[str, str],
                         versions: dict[str, list[int]]) -> None:
    """The subjects of topic ``mine[0]`` (prefix ``mine[1]``) and ``theirs[0]`` (prefix
    ``theirs[1]``) hold the same schema texts, version for version, but for the prefix."""
    client = SchemaRegistryClient({"url": registry.ccompat_url})
    for part, numbers in versions.items():
        assert client.get_versions(f"{mine[0]}-{part}") == numbers
        assert client.get_versions(f"{theirs[0]}-{part}") == numbers
        for version in numbers:
            ours = client.get_version(f"{mine[0]}-{part}", version).schema.schema_str or ""
            their = client.get_version(f"{theirs[0]}-{part}", version).schema.schema_str or ""
            # the same text, property order included, but for the prefix
            assert ours.replace(f"{mine[1]}.public", "PFX.public") == their.replace(
                f"{theirs[1]}.public", "PFX.public"), f"{part} v{version}:\nours {ours}\ntheirs {their}"


def evolve_then_refuse(db: str, broker: ApacheKafka, registry: ApicurioRegistry, topic_prefix: str,
                       capture: tuple[str, ...], inserts: tuple[str, str, str],
                       rules: tuple[str, str], breaking: str) -> tuple[list[Msg], str]:
    """A captured table (already created) through one relay: ``inserts[0]``; the value
    subject's rule set to ``rules[0]``, ADD COLUMN ``extra text``, ``inserts[1]`` (a second
    version); the rule ``rules[1]``, the ``breaking`` DDL and ``inserts[2]``: the relay must
    stop (exit 4) with the refused version unregistered and the slot not confirmed past it.
    Returns the table's messages and the stop line."""
    from cdc_relay.errors import ExitCode
    from tests.integration.wal_support import confirmed_flush, current_wal
    from tests.support import wait_for

    topic = f"{topic_prefix}.public.items"
    subject = f"{topic}-value"
    client = SchemaRegistryClient({"url": registry.ccompat_url})
    relay = start_relay(db, broker.bootstrap, topic_prefix, plugin="pgoutput", extra=capture)
    try:
        with psycopg.connect(db, autocommit=True) as conn, \
                KafkaCollector(broker.bootstrap, topic_prefix) as collector:
            conn.execute(inserts[0])
            collector.collect(until=lambda ms: any(m.topic == topic for m in ms), timeout=60)
            assert client.get_versions(subject) == [1]
            assert client.get_compatibility(subject) == "NONE"  # Apicurio's default: no rule
            client.set_compatibility(subject, rules[0])
            conn.execute("ALTER TABLE items ADD COLUMN extra text")
            conn.execute(inserts[1])
            got = collector.collect(until=lambda ms: len([m for m in ms if m.topic == topic]) >= 2,
                                    timeout=60)
            assert client.get_versions(subject) == [1, 2]  # ADD COLUMN: a new version
            client.set_compatibility(subject, rules[1])
            conn.execute(breaking)
            conn.execute(inserts[2])
            after = current_wal(db)
        wait_for(lambda: not relay.running(), timeout=60, message="the relay stopping")
        assert relay.proc.returncode == ExitCode.DATA, relay.stderr
    finally:
        relay.stop()
    lines = [line for line in relay.stderr.splitlines() if "refused the new" in line]
    assert len(lines) >= 1, relay.stderr
    assert "public.items" in lines[0] and subject in lines[0] and rules[1] in lines[0], lines[0]
    assert client.get_versions(subject) == [1, 2]
    assert confirmed_flush(db) < after  # not confirmed past the refused change
    return [m for m in got if m.topic == topic], lines[0]
