"""Where a WAL-mode backlog's time goes, per process and per relay thread (benchmarks/history/
2026-12-03-pgoutput-profile.md).

    .venv/bin/python scripts/profile_wal.py --events 100000 --plugin pgoutput --rounds 3 \
        [--config default --config linger.ms=20 ...] [--out /tmp/profile-wal]

One fresh PostgreSQL, the backlog preloaded once (~200 B events, 100 per transaction, as the
benchmarks) behind one slot per measurement, created before it. Then, alternating, per
round: pg_recvlogical alone (the server's own rate and the walsender's CPU), and
``cdc-relay run`` once per ``--config`` (``default``, or librdkafka ``KEY=VALUE[,KEY=VALUE]``
passed as --producer-config) on a fresh Tansu, until its slot confirmed the end. While the
relay runs, every 0.1 s: each relay thread's (/proc/PID/task), the walsender's (all of
its life) and the broker's (from the relay's spawn) schedstat - time on a CPU, time
runnable but waiting for one (the machine's other load), and the rest of the wall time,
asleep (waiting for input: WAL, the broker's replies, the socket) - and CPU seconds of all
of PostgreSQL. The relay's start-up (up to its
"streaming from slot" line) is taken off. Prints and writes ``--out``/profile.json: per
measurement, microseconds per event by process and thread, and wall seconds.

On a shared machine only the CPU figures mean much, and they move by 10-20 % between
rounds: compare medians of alternating rounds. Must not: run inside ``benchmarks run``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.kafka_side import create_topics
from benchmarks.limits import _drain
from benchmarks.plan import EVENTS_PER_BACKLOG_TXN
from benchmarks.procs import RelayProcess, run_cli
from benchmarks.procstat import postmaster_pid, tree_cpu_seconds
from benchmarks.runner import scalar
from benchmarks.workload import preload
from cdc_relay.config import TableRef
from cdc_relay.decoding.pgoutput import plugin_options as pgoutput_options
from cdc_relay.decoding.wal2json import plugin_options as wal2json_options
from cdc_relay.local.broker import Broker
from cdc_relay.local.postgres import PostgresCluster

TOPIC = "bench.backlog"
Sched = tuple[float, float]  # (seconds on a CPU, seconds runnable waiting for one)


def schedstat(path: Path) -> Sched:
    on, wait, _ = (path / "schedstat").read_text().split()
    return int(on) / 1e9, int(wait) / 1e9


def threads(pid: int) -> dict[str, Sched]:
    """Each thread of ``pid`` by name ("main" for the main thread; same names added up)."""
    out: dict[str, Sched] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError, ValueError):
            name = "main" if task.name == str(pid) else (task / "comm").read_text().strip()
            on, wait = schedstat(task)
            before = out.get(name, (0.0, 0.0))
            out[name] = (before[0] + on, before[1] + wait)
    return out


def process(pid: int) -> Sched:
    """The whole process (every thread) of ``pid``."""
    on = wait = 0.0
    for sched in threads(pid).values():
        on, wait = on + sched[0], wait + sched[1]
    return on, wait


def relay_run(dsn: str, plugin: str, slot: str, end: str, logs: Path, settings: list[str],
              postmaster: int) -> dict[str, Any]:
    """One relay on a fresh broker until ``slot`` confirmed ``end``: the last sample."""
    with Broker() as broker, psycopg.connect(dsn, autocommit=True) as conn:
        create_topics(broker.bootstrap, [TOPIC, "bench.dlq"])
        extra = [arg for s in settings for arg in ("--producer-config", s)]
        log = logs / f"{slot}.log"
        log.unlink(missing_ok=True)
        pg_before, broker_before = tree_cpu_seconds(postmaster), process(broker.pid)
        relay = RelayProcess(["run", "--dsn", dsn, "--brokers", broker.bootstrap, "--plugin",
                              plugin, "--slot", slot, "--topic-pattern", "bench.{aggregate_type}",
                              "--dead-letter-topic", "bench.dlq", "--log-level", "info", *extra],
                             log)
        first: dict[str, Any] | None = None
        last: dict[str, Any] = {}
        try:
            while True:
                relay.check_alive()
                sender = scalar(conn, "SELECT active_pid FROM pg_replication_slots "
                                      "WHERE slot_name = %s", slot)
                now: dict[str, Any] = {"t": time.perf_counter(), "relay": threads(relay.pid),
                                       "broker": process(broker.pid)}
                if sender:
                    with contextlib.suppress(OSError):
                        now["walsender"] = process(int(sender))
                now["pg"] = tree_cpu_seconds(postmaster) - pg_before
                if first is None:
                    if "streaming from slot" in log.read_text(errors="replace"):
                        first = now  # start-up done: what follows is the events'
                else:
                    last = now
                    if scalar(conn, "SELECT confirmed_flush_lsn >= %s::pg_lsn FROM "
                                    "pg_replication_slots WHERE slot_name = %s", end, slot):
                        break
                time.sleep(0.1)
        finally:
            relay.stop()
    assert first is not None
    # The walsender starts with the relay's connection and may decode ahead before the
    # first sample: all of its time counts; the broker's from before the relay started.
    first["walsender"], first["broker"] = (0.0, 0.0), broker_before
    return {"first": first, "last": last}


def per_event(run: dict[str, Any], events: int) -> dict[str, Any]:
    """Microseconds per event (on CPU, waiting for one, asleep) between the two samples."""
    first, last = run["first"], run["last"]
    wall = last["t"] - first["t"]
    us = 1e6 / events

    def split(a: Sched, b: Sched) -> dict[str, float]:
        on, wait = b[0] - a[0], b[1] - a[1]
        return {"cpu": round(on * us, 2), "runqueue": round(wait * us, 2),
                "asleep": round((wall - on - wait) * us, 2)}

    out: dict[str, Any] = {"wall_s": round(wall, 2), "eps": round(events / wall)}
    relay = {name: split(first["relay"].get(name, (0.0, 0.0)), sched)
             for name, sched in last["relay"].items()}
    out["relay threads"] = {k: v for k, v in relay.items() if v["cpu"] > 0}
    out["relay cpu"] = round(sum(v["cpu"] for v in relay.values()), 2)
    if "walsender" in first and "walsender" in last:
        out["walsender"] = split(first["walsender"], last["walsender"])
    out["broker"] = split(first["broker"], last["broker"])
    out["postgresql cpu (all)"] = round((last["pg"] - first["pg"]) * us, 2)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100000)
    parser.add_argument("--plugin", default="pgoutput", choices=("pgoutput", "wal2json"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--config", action="append", default=[],
                        help="default, or KEY=VALUE[,KEY=VALUE] librdkafka settings (repeatable)")
    parser.add_argument("--out", type=Path, default=Path("/tmp/profile-wal"))
    args = parser.parse_args()
    configs = args.config or ["default"]
    logs = args.out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    results: dict[str, list[dict[str, Any]]] = {"pg_recvlogical": [], **{c: [] for c in configs}}
    with PostgresCluster(settings={"full_page_writes": "on"}) as cluster:
        dsn = cluster.create_database("profile")
        run_cli(["init", "--dsn", dsn, "--plugin", args.plugin, "--no-slot", "--no-trigger"],
                logs / "init.log")
        options = (pgoutput_options("cdc_relay_outbox") if args.plugin == "pgoutput"
                   else wal2json_options(TableRef.parse("public.outbox_events")))
        with psycopg.connect(dsn, autocommit=True) as conn:
            if args.plugin == "pgoutput":  # as `init` makes it (--no-slot makes none)
                conn.execute("CREATE PUBLICATION cdc_relay_outbox FOR TABLE "
                             "public.outbox_events WITH (publish = 'insert')")
            for r in range(args.rounds):
                for slot in [f"recv_{r}", *(f"relay_{c}_{r}" for c in range(len(configs)))]:
                    conn.execute("SELECT pg_create_logical_replication_slot(%s, %s)",
                                 (slot, args.plugin))
        preload(dsn, args.events, EVENTS_PER_BACKLOG_TXN, "backlog")
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE outbox_events")
            conn.execute("CHECKPOINT")
            end = str(scalar(conn, "SELECT pg_current_wal_lsn()::text"))
        postmaster = postmaster_pid(cluster.data_dir)
        for r in range(args.rounds):
            recv = _drain(cluster, dsn, f"recv_{r}", options, end, args.events)
            results["pg_recvlogical"].append({
                "wall_s": round(recv["seconds"], 2), "eps": round(recv["eps"]),
                "postgresql cpu (all)": round(recv["pg_cpu_s"] * 1e6 / args.events, 2)})
            for c, config in enumerate(configs):
                settings = [] if config == "default" else config.split(",")
                run = relay_run(dsn, args.plugin, f"relay_{c}_{r}", end, logs, settings,
                                postmaster)
                results[config].append(per_event(run, args.events))
                print(json.dumps({config: results[config][-1]}), flush=True)
    summary = {"events": args.events, "plugin": args.plugin, "rounds": results,
               "medians": {name: _medians(runs) for name, runs in results.items()}}
    (args.out / "profile.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary["medians"], indent=2))


def _medians(runs: list[dict[str, Any]]) -> Any:
    """Each number's median over the rounds (nested dicts alike)."""
    first = runs[0]
    if isinstance(first, dict):
        return {k: _medians([r[k] for r in runs if k in r]) for k in first}
    return round(statistics.median(runs), 2) if isinstance(first, int | float) else first


if __name__ == "__main__":
    main()
