"""Instructions per event: the relay's CPU cost counted, not timed (``python -m benchmarks instructions``).

On a shared 2-core machine whose speed wanders, CPU seconds per event move by a quarter
or more between identical runs (benchmarks/history/2026-12.md, "Instructions per event"), which
hides any change to the hot path smaller than that. valgrind's callgrind counts the
instructions a process executes instead: the same count for the same code, libraries and
input, whatever else the machine is doing. One pair of counts judges a change.

What is counted, per plugin: ``cdc-relay run`` under ``valgrind --tool=callgrind
--separate-threads=yes``, twice - on a slot with nothing to read (start-up, a moment of
idling, shutdown) and on a slot holding a backlog of N events (the same, plus the
events). Both runs end alike: SIGTERM once the relay logged that it streams and the slot
confirmed everything there was. The difference over N is the cost of one event, for the
main thread (reading, decoding, routing, producing, the delivery reports) and for the
whole process (librdkafka's threads too). PostgreSQL and the broker are not counted.

Under callgrind the relay runs ~50 times slower than the walsender feeding it, so it never
waits for WAL: its read batches are full and delivery reports arrive in larger groups
than at full speed. The count is a cost per event to compare between commits, not a
prediction of seconds: how many instructions a second runs differs by machine and load.
Two runs of the same commit agree within 0.2-1.2 % (the reports a poll serves move with
the broker's pace); the whole command takes about a minute
for both plugins (20,000 events).

Must not: run inside ``benchmarks run`` (valgrind's CPU would be the very noise the full
run measures). Its one need beyond the full run's is valgrind (scripts/bootstrap.sh
installs it as root); without it, one clear line.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import psycopg

from benchmarks.kafka_side import create_topics
from benchmarks.machine import machine_info
from benchmarks.plan import EVENTS_PER_BACKLOG_TXN
from benchmarks.procs import RelayProcess, byte_compile, code_under_test, run_cli
from benchmarks.runner import scalar
from benchmarks.workload import preload
from cdc_relay.local.broker import Broker
from cdc_relay.local.postgres import PostgresCluster

PLUGINS = ("wal2json", "pgoutput")
# Where the main thread's instructions go: C functions whose inclusive count (callee
# included) callgrind_annotate reports, by the name a reader knows them by. None of them
# recurses, so their inclusive counts are exact. The Python interpreter's own share is
# the self count of its evaluation loop (the bytecode, not what it calls).
PARTS = (
    ("Producer_produce", "produce (confluent-kafka, librdkafka)"),
    ("Producer_poll", "poll: delivery reports, each with its Python callbacks"),
    ("dr_msg_cb", "  of which one report (confluent-kafka's Message, our callbacks)"),
    ("Message_new0", "    of which confluent-kafka's Message"),
    ("changes_call", "the compiled reader: get_copy_data, the header, decode"),
    ("reader_insert", "  of which pgoutput's compiled decoder (insert)"),
    ("reader_row", "  of which wal2json's compiled decoder (row)"),
    ("select_select", "select (waiting for WAL)"),
    ("gc_collect_main", "cyclic garbage collector"),
)
EVAL_LOOP = "_PyEval_EvalFrameDefault"
TOPIC = "bench.backlog"  # aggregate_type "backlog" under the pattern below
VALGRIND_TIMEOUT = 900.0  # one relay under callgrind: start-up ~15 s, ~0.4 ms per event
_TOTALS = re.compile(rb"^(?:summary|totals):\s*(\d+)", re.MULTILINE)
# A callgrind_annotate line: "  1,189,163,468 (12.14%)  file:function [object]".
_ANNOTATED = re.compile(r"^\s*([\d,]+)\s+\(\s*[\d.]+%\)\s+\S*?:([A-Za-z_]\w*)(?:'\d+)?(?:\s|$)")


def valgrind() -> str:
    """The valgrind executable; RuntimeError (one line) when it is not installed."""
    path = shutil.which("valgrind")
    if path is None:
        raise RuntimeError("valgrind is not installed (apt-get install valgrind): "
                           "'benchmarks instructions' counts with its callgrind tool")
    return path


def measure(events: int, plugins: tuple[str, ...], out: Path) -> dict[str, Any]:
    """Count every plugin's instructions per event; write ``out``/instructions.json."""
    tool = valgrind()
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    byte_compile(*code_under_test())  # start as an installed relay does (procs.py)
    results: dict[str, Any] = {"events": events, "plugins": {}}
    with PostgresCluster(settings={"full_page_writes": "on"}) as cluster, Broker() as broker:
        cluster.require_plugin("wal2json")
        results["machine"] = machine_info(cluster)
        dsn = cluster.create_database("instructions")
        create_topics(broker.bootstrap, [TOPIC, "bench.dlq"])
        init = logs / "init.log"
        for plugin in plugins:  # a slot before the backlog sees it, one after sees nothing
            run_cli(["init", "--dsn", dsn, "--plugin", plugin, "--no-trigger",
                     "--slot", f"ir_{plugin}"], init)
        preload(dsn, events, EVENTS_PER_BACKLOG_TXN, "backlog")
        for plugin in plugins:
            run_cli(["init", "--dsn", dsn, "--plugin", plugin, "--no-trigger",
                     "--slot", f"ir_{plugin}_idle"], init)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CHECKPOINT")
            end = str(scalar(conn, "SELECT pg_current_wal_insert_lsn()::text"))
            for plugin in plugins:
                idle = _count(tool, conn, dsn, broker.bootstrap, plugin, f"ir_{plugin}_idle",
                              None, logs)
                backlog = _count(tool, conn, dsn, broker.bootstrap, plugin, f"ir_{plugin}",
                                 end, logs)
                parts = {name: round((backlog["parts"].get(name, 0) - idle["parts"].get(name, 0))
                                     / events) for name in backlog["parts"]}
                results["plugins"][plugin] = {
                    "idle": idle, "backlog": backlog,
                    "main_per_event": round((backlog["main"] - idle["main"]) / events),
                    "process_per_event": round((backlog["process"] - idle["process"]) / events),
                    "main_parts_per_event": parts,
                }
    (out / "instructions.json").write_text(json.dumps(results, indent=2) + "\n")
    return results


def _count(tool: str, conn: psycopg.Connection[Any], dsn: str, bootstrap: str, plugin: str,
           slot: str, until: str | None, logs: Path) -> dict[str, int]:
    """One relay under callgrind until it streams and ``slot`` confirmed ``until``; its counts."""
    prefix = logs / f"callgrind-{slot}"
    log = logs / f"{slot}.log"
    for old in (log, *logs.glob(f"{prefix.name}.*")):  # an earlier run's, in the same --out
        old.unlink(missing_ok=True)
    wrapper = [tool, "--tool=callgrind", "--separate-threads=yes",
               f"--callgrind-out-file={prefix}.%p"]
    relay = RelayProcess(["run", "--dsn", dsn, "--brokers", bootstrap, "--plugin", plugin,
                          "--slot", slot, "--topic-pattern", "bench.{aggregate_type}",
                          "--dead-letter-topic", "bench.dlq", "--log-level", "info"],
                         log, wrapper=wrapper)
    try:
        deadline = time.monotonic() + VALGRIND_TIMEOUT
        while not _done(conn, relay, slot, until):
            relay.check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"{slot}: the relay under callgrind did not finish within "
                                   f"{VALGRIND_TIMEOUT:.0f} s (log: {relay.log})")
            time.sleep(0.2)
    finally:
        code = relay.stop(timeout=120.0)
    if code != 0:
        raise RuntimeError(f"{slot}: the relay exited with {code} (log: {relay.log})")
    return _totals(prefix)


def _done(conn: psycopg.Connection[Any], relay: RelayProcess, slot: str, until: str | None) -> bool:
    if "streaming from slot" not in relay.log.read_text(errors="replace"):
        return False
    if until is None:
        return True
    return bool(scalar(conn, "SELECT confirmed_flush_lsn >= %s::pg_lsn FROM pg_replication_slots"
                           " WHERE slot_name = %s", until, slot))


def _totals(prefix: Path) -> dict[str, int]:
    """Instructions of the main thread (callgrind's thread 1) and of every thread."""
    counts: dict[int, int] = {}
    main = prefix
    for path in prefix.parent.glob(f"{prefix.name}.*"):
        if path.stat().st_size == 0:  # with --separate-threads the process's own file stays empty
            continue
        thread = int(path.name.rsplit("-", 1)[1]) if "-" in path.name.rsplit(".", 1)[1] else 1
        found = _TOTALS.search(path.read_bytes())
        if found is None:
            raise RuntimeError(f"no instruction count in {path}")
        counts[thread] = counts.get(thread, 0) + int(found.group(1))
        if thread == 1:
            main = path
    if 1 not in counts:
        raise RuntimeError(f"callgrind wrote no count for the main thread ({prefix}.*)")
    return {"main": counts[1], "process": sum(counts.values()), "threads": len(counts),
            "parts": _parts(main)}


def _parts(path: Path) -> dict[str, int]:
    """Inclusive counts of the PARTS functions and the evaluation loop's self count."""
    annotate = shutil.which("callgrind_annotate")
    if annotate is None:  # valgrind without its perl scripts: the totals still stand
        return {}
    found: dict[str, int] = {}
    for inclusive in (True, False):
        done = subprocess.run([annotate, f"--inclusive={'yes' if inclusive else 'no'}",
                               "--threshold=100", str(path)], capture_output=True, text=True,
                              check=False, timeout=300)
        found.update(annotated(done.stdout, inclusive=inclusive))
    return found


def annotated(text: str, *, inclusive: bool) -> dict[str, int]:
    """From callgrind_annotate's listing: the PARTS (inclusive) or EVAL_LOOP (self) counts.

    A function is listed once per source file of its inlined parts and, when it
    recurses, once per depth: self counts are disjoint (added up), an inclusive one
    already holds the others (the largest is taken).
    """
    wanted = {name for name, _ in PARTS} if inclusive else {EVAL_LOOP}
    found: dict[str, int] = {}
    for line in text.splitlines():
        match = _ANNOTATED.match(line)
        if match is None or match.group(2) not in wanted:
            continue
        name, count = match.group(2), int(match.group(1).replace(",", ""))
        found[name] = max(found.get(name, 0), count) if inclusive else found.get(name, 0) + count
    return found


def table(results: dict[str, Any]) -> str:
    """The counts as a Markdown table."""
    lines = [f"Instructions per event (callgrind; {results['events']:,}-event backlog minus an "
             f"empty slot; git {results.get('machine', {}).get('git_commit', '?')})", "",
             "| plugin | main thread / event | whole process / event | start-up + idle (main) |",
             "|---|---|---|---|"]
    for plugin, r in results["plugins"].items():
        lines.append(f"| {plugin} | {r['main_per_event']:,} | {r['process_per_event']:,} | "
                     f"{r['idle']['main']:,} |")
    for plugin, r in results["plugins"].items():
        parts = r.get("main_parts_per_event") or {}
        if not parts:
            continue
        lines += ["", f"{plugin}, main thread, per event (inclusive: callees counted):", ""]
        lines += [f"- {label}: {parts[name]:,}" for name, label in PARTS if parts.get(name)]
        if EVAL_LOOP in parts:
            lines.append(f"- Python bytecode (the evaluation loop itself): {parts[EVAL_LOOP]:,}")
    return "\n".join(lines)


def run(events: int, plugins: tuple[str, ...], out: Path) -> str:
    """Measure and return the table (the command line prints it)."""
    return table(measure(events, plugins, out))


if __name__ == "__main__":  # pragma: no cover - use ``python -m benchmarks instructions``
    raise SystemExit("use: python -m benchmarks instructions --out DIR")
