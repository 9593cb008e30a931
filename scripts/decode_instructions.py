"""Callgrind instructions per decoded outbox insert, for both plugins and both paths.

A development measurement (docs/decisions/2026-12-03-compiled-extensions.md), not a test or a
benchmark of the relay: it builds a stream of 2000 inserts from the captured fixture
rows (tests/fixtures), with ``created_at`` shared by each 100 rows (one ``now()`` per
transaction) or distinct on every row (a ``clock_timestamp()`` default), decodes it in a
loop under ``valgrind --tool=callgrind`` twice (a warm-up pass, then with more passes)
and prints the difference per insert, which leaves out start-up and the first pass.

    PYTHONPATH=$PWD python scripts/decode_instructions.py            # the table
    PYTHONPATH=$PWD python scripts/decode_instructions.py --run wal2json shared compiled 3

Must not: be imported by cdc_relay, or measure anything but ``decode`` calls (the stream
is built before the passes; the loop around ``decode`` is the same for every column).
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROWS = 2000
PER_TRANSACTION = 100
PASSES = 5
FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures"
CREATED_AT = "2026-11-30 11:11:26.123456+00"
ID = "00000000-0000-4000-8000-000000000001"


def _timestamp(row: int, shared: bool) -> str:
    """A text as PostgreSQL prints it; the same length as CREATED_AT for every row."""
    tick = row // PER_TRANSACTION if shared else row
    seconds, micros = divmod(123456 + tick * 7919, 1_000_000)
    return f"2026-11-30 11:{11 + seconds // 60:02d}:{seconds % 60:02d}.{micros:06d}+00"


def _first(name: str, kind: str) -> tuple[str, str]:
    """(wal_start, payload) of the first fixture message whose payload starts with ``kind``."""
    for line in (FIXTURES / name).read_text(encoding="utf-8").splitlines():
        message = json.loads(line)
        payload = message["payload"]
        head = base64.b64decode(payload)[:1].decode() if name.startswith("pgoutput") else (
            json.loads(payload)["action"])
        if head == kind:
            return message["wal_start"], payload
    raise LookupError(f"no {kind!r} message in {name}")


def stream(plugin: str, shared: bool) -> list[tuple[int, bytes]]:
    """(wal_start, payload) of the messages to decode: a Relation (pgoutput), the inserts."""
    from cdc_relay.model import Lsn

    if plugin == "wal2json":
        wal_start, text = _first("wal2json_v2.jsonl", "I")
        assert ID in text and CREATED_AT in text
        start = Lsn.parse(wal_start)
        return [(Lsn(start + 96 * i), text.replace(ID, f"{ID[:-12]}{i:012d}")
                 .replace(CREATED_AT, _timestamp(i, shared)).encode()) for i in range(ROWS)]
    _, relation = _first("pgoutput_v1.jsonl", "R")
    wal_start, insert = _first("pgoutput_v1.jsonl", "I")
    row = base64.b64decode(insert)
    assert ID.encode() in row and CREATED_AT.encode() in row
    start = Lsn.parse(wal_start)
    return [(Lsn(0), base64.b64decode(relation))] + [
        (Lsn(start + 96 * i), row.replace(ID.encode(), f"{ID[:-12]}{i:012d}".encode())
         .replace(CREATED_AT.encode(), _timestamp(i, shared).encode())) for i in range(ROWS)]


def run(plugin: str, mode: str, path: str, passes: int) -> None:
    """Decode the stream ``passes`` times (inside callgrind)."""
    from cdc_relay import accel
    from cdc_relay.config import TableRef
    from cdc_relay.decoding.pgoutput import PgOutputDecoder
    from cdc_relay.decoding.wal2json import Wal2JsonDecoder
    from cdc_relay.model import OutboxColumns, OutboxEvent

    table, columns, compiled = TableRef("public", "outbox_events"), OutboxColumns(), path == "compiled"
    with accel.forced(not compiled):
        decoder = (Wal2JsonDecoder(table, columns) if plugin == "wal2json"
                   else PgOutputDecoder(table, columns))
    # memoryviews into a larger buffer, as the replication stream hands them out
    messages = [(lsn, memoryview(b"w" * 25 + payload)[25:])
                for lsn, payload in stream(plugin, mode == "shared")]
    decode = decoder.decode
    for _ in range(passes):
        for wal_start, payload in messages:
            decode(payload, wal_start)
    last = decode(messages[-1][1], messages[-1][0])
    assert isinstance(last, OutboxEvent) and last.created_at_ms is not None


def instructions(args: list[str]) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
                        sys.executable, __file__, "--run", *args], check=True,
                       capture_output=True)
        match = re.search(r"^summary: (\d+)", out.read_text(), re.MULTILINE)
        assert match is not None
        return int(match.group(1))


def main() -> None:
    if sys.argv[1:2] == ["--run"]:
        plugin, mode, path, passes = sys.argv[2:6]
        run(plugin, mode, path, int(passes))
        return
    print("| plugin | created_at | pure | compiled |")
    print("|---|---|---|---|")
    for plugin in ("wal2json", "pgoutput"):
        for mode in ("shared", "distinct"):
            cells = []
            for path in ("pure", "compiled"):
                base = instructions([plugin, mode, path, "1"])
                more = instructions([plugin, mode, path, str(1 + PASSES)])
                cells.append(f"{(more - base) / (PASSES * ROWS):,.0f}")
            label = f"shared by {PER_TRANSACTION} rows" if mode == "shared" else "new every row"
            print(f"| {plugin} | {label} | {cells[0]} | {cells[1]} |", flush=True)


if __name__ == "__main__":
    main()
