"""Debezium embedded (pydbzengine) with its Outbox Event Router on a bytea outbox: the
reference for pre-encoded payloads (docs/messages.md, pre-encoded payloads).

``python -m tests.integration.debezium_outbox_child DSN SLOT TOPIC_PREFIX COUNT OUT``:
runs Debezium's PostgreSQL connector with ``io.debezium.transforms.outbox.EventRouter`` as
the benchmarks set it up (benchmarks/debezium.py ``engine_properties``: pgoutput, the slot
and ``init``'s publication, cdc-relay's column names, ``snapshot.mode=no_data``), the key as
a string (``SimpleString``: StringConverter) and the value through the ``Binary`` format
(``io.debezium.converters.BinaryDataConverter``, the successor of the
``ByteBufferConverter`` Debezium's docs name for Avro payloads) until COUNT records
arrived (or two minutes); writes them to OUT as JSON lines [topic, key, value in hex],
exits. A process of its own: the JVM stays out of the test worker.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
from typing import Any


def main(dsn: str, slot: str, prefix: str, count: str, out: str) -> int:
    os.chdir(tempfile.mkdtemp(prefix="dbz-outbox-child-"))  # pydbzengine's log file: ./logs
    from pydbzengine import BasePythonChangeHandler, DebeziumEngine
    from pydbzengine.engine.jvm import ensure_jvm_started

    ensure_jvm_started(jvm_opts=["-Xrs"])
    import jpype

    got: list[tuple[str, str | None, str | None]] = []
    enough = threading.Event()

    class Handler(BasePythonChangeHandler):
        def handleJsonBatch(self, records: list[Any]) -> None:  # Java's name
            for record in records:
                value = record.value()
                got.append((str(record.destination()), None if record.key() is None
                            else str(record.key()), None if value is None else bytes(value).hex()))
            if len(got) >= int(count):
                enough.set()

    from benchmarks.debezium import engine_properties  # the benchmark's router set-up

    props = engine_properties(dsn, prefix + ".{aggregate_type}", os.path.abspath("offsets"),
                              slot=slot)
    formats = "io.debezium.engine.format."
    engine_format = jpype.JClass("io.debezium.engine.format.KeyValueChangeEventFormat").of(
        jpype.JClass(formats + "SimpleString"), jpype.JClass(formats + "Binary"))
    engine = DebeziumEngine(properties=props, handler=Handler(), format=engine_format)
    thread = threading.Thread(target=engine.run, daemon=True)
    thread.start()
    enough.wait(120)  # the handler sets it at COUNT records
    engine.close()
    with open(out, "w", encoding="utf-8") as f:
        for item in got:
            f.write(json.dumps(item) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
