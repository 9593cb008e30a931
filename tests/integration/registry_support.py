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


def debezium_records(db: str, prefix: str, registry: ApicurioRegistry, out: Path, count: int,
                     *converter: str, tables: str = "public.items",
                     properties: dict[str, str] | None = None) -> list[Any]:
    """[topic, key hex, value hex] of the first ``count`` records Debezium embedded writes
    from slot ``dbz`` and publication ``dbz_pub`` with ``converter`` (default: Avro)."""
    info = conninfo_to_dict(db)
    env = dict(os.environ, DEBEZIUM_CHILD_PROPERTIES=json.dumps(properties or {}))
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
