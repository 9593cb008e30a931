"""Which Kafka broker a benchmark run measures against: the ``--broker`` choice.

Owns the choice (``kafka``: Apache Kafka 4.1, a single-node KRaft broker on the JVM, the
default and the headline's broker; ``tansu``: the memory-only Tansu broker the runs before
2026-12-04 used), how a fresh broker of that kind is made for one measurement
(``new_broker``), and how the broker is described in results.json and the report
(``describe``, pure).

Every measurement that talks to Kafka (a mode's backlog and latency phases, the bare
producer, the broker floor, the message check, the backfill benchmark) gets a broker of
its own from here, as it did when Tansu was the only one: Apache Kafka's start (~4 s on
a quiet machine, ~11 s with the two cores busy) happens before the measured span, and
a fresh JVM keeps one mode's heap, page cache and log segments out of the next mode's
figures.

Must not: create topics, start a relay, or read PostgreSQL.
"""

from __future__ import annotations

from typing import Any

from cdc_relay.local.apache_kafka import KAFKA_4_1, ApacheKafka
from cdc_relay.local.broker import Broker
from cdc_relay.local.kafka_process import KafkaProcess

KAFKA = "kafka"
TANSU = "tansu"
BROKERS = (KAFKA, TANSU)
DEFAULT_BROKER = KAFKA
KAFKA_VERSION = KAFKA_4_1


def new_broker(kind: str) -> KafkaProcess:
    """A broker of ``kind``, not yet started (use it as a context manager).

    Apache Kafka runs with the JVM's full JIT (``fast_start=False``): the tests' C1-only
    flag starts it sooner but runs it slower, which would be charged to the broker here.
    """
    if kind == KAFKA:
        return ApacheKafka(KAFKA_VERSION, fast_start=False)
    if kind == TANSU:
        return Broker()
    raise ValueError(f"unknown broker {kind!r}; known: {', '.join(BROKERS)}")


def describe(kind: str, tansu_version: str = "tansu") -> dict[str, Any]:
    """results.json's ``broker``: kind, name, version and how it keeps its data.

    ``tansu_version`` is ``tansu --version``'s first line (``tansu 0.6.0``), read by the
    caller (benchmarks/machine.py).
    """
    if kind == KAFKA:
        return {"kind": KAFKA, "name": "Apache Kafka", "version": KAFKA_VERSION,
                "label": f"Apache Kafka {KAFKA_VERSION}",
                "storage": "single-node KRaft (broker+controller), log on local disk "
                           "(Kafka's default: the page cache, no fsync per batch), JVM -Xmx512m, "
                           "SerialGC, full JIT"}
    if kind == TANSU:
        version = tansu_version.split()[-1] if tansu_version.split() else "?"
        return {"kind": TANSU, "name": "Tansu", "version": version, "label": tansu_version,
                "storage": "memory only (nothing on disk)"}
    raise ValueError(f"unknown broker {kind!r}; known: {', '.join(BROKERS)}")


def broker_line(results: dict[str, Any]) -> str:
    """The broker as the headline names it; a results.json from before ``--broker`` was Tansu's."""
    broker = results.get("broker")
    if isinstance(broker, dict) and broker.get("label"):
        return f"{broker['label']}, {broker['storage']}"
    machine = results.get("machine") or {}
    return f"{machine.get('broker', 'tansu')}, memory only (nothing on disk)"


def broker_label(results: dict[str, Any]) -> str:
    """``Apache Kafka 4.1.2`` or ``tansu 0.6.0``: a run's broker in a few words."""
    broker = results.get("broker")
    if isinstance(broker, dict) and broker.get("label"):
        return str(broker["label"])
    return str((results.get("machine") or {}).get("broker", "tansu"))


def broker_short(results: dict[str, Any]) -> str:
    """``Kafka`` or ``Tansu``: a run's broker in a table header."""
    broker = results.get("broker")
    kind = broker.get("kind") if isinstance(broker, dict) else TANSU
    return {KAFKA: "Kafka", TANSU: "Tansu"}.get(str(kind), str(kind))
