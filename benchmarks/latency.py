"""One latency measurement: a writer at a fixed rate, a consumer stamping receipts.

The writer (a spawned child: ``workload.rate_writer`` through the relay, or
``kafka_side.floor_producer_process`` straight to the broker) pickles ``{event id:
commit or send time}``; the consumer (``kafka_side.receipt_process``) pickles ``{event
id: receipt time}``. Both use ``time.time()`` on this host, so a latency is a plain
difference. Events not received within the drain timeout are reported as ``missing``
(never silently dropped from the statistics' denominator).

Must not: start services or the relay.
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.kafka_side import receipt_process
from benchmarks.procs import CTX, finish, spawn, wait_event
from benchmarks.progress import Progress

CDF_POINTS = 201  # quantiles 0, 0.5, …, 100 % kept in results.json for the plots


def latency_stats(commits: dict[str, float], receipts: dict[str, float]) -> dict[str, Any]:
    """p50/p95/p99/max (ms) over the events in ``commits`` that were received."""
    samples = np.array([(receipts[i] - t) * 1000 for i, t in commits.items() if i in receipts])
    if samples.size == 0:
        return {"samples": 0, "missing": len(commits), "p50_ms": float("nan"),
                "p95_ms": float("nan"), "p99_ms": float("nan"), "max_ms": float("nan"),
                "p99_9_ms": float("nan"), "mean_ms": float("nan"), "cdf_ms": []}
    p50, p95, p99, p999 = np.percentile(samples, [50, 95, 99, 99.9])
    cdf = np.percentile(samples, np.linspace(0, 100, CDF_POINTS))
    return {"samples": int(samples.size), "missing": len(commits) - int(samples.size),
            "p50_ms": round(float(p50), 3), "p95_ms": round(float(p95), 3),
            "p99_ms": round(float(p99), 3), "max_ms": round(float(samples.max()), 3),
            "p99_9_ms": round(float(p999), 3), "mean_ms": round(float(samples.mean()), 3),
            "cdf_ms": [round(float(v), 3) for v in cdf]}


def measure(progress: Progress, bootstrap: str, topic: str, writer: Callable[..., None],
            writer_args: tuple[Any, ...], *, seconds: float, drain_timeout: float, workdir: Path,
            check: Callable[[], None] = lambda: None) -> dict[str, Any]:
    """Run ``writer(*writer_args, out_path, written)`` against a consumer of ``topic``.

    ``seconds`` is the writer's whole run (warm-up included); after it ends, wait up to
    ``drain_timeout`` for the rest to arrive. ``check`` is called while waiting (the
    relay's liveness). Returns latency_stats plus writer facts.
    """
    received = CTX.Value("q", 0)
    written = CTX.Value("q", 0)
    ready, stop = CTX.Event(), CTX.Event()
    receipts_path, commits_path = workdir / f"{topic}.receipts.pkl", workdir / f"{topic}.commits.pkl"
    consumer = spawn(receipt_process, bootstrap, topic, str(receipts_path), received, ready, stop)
    producer = None
    try:
        wait_event(ready, consumer, "the latency consumer")
        producer = spawn(writer, *writer_args, str(commits_path), written)
        deadline = time.monotonic() + seconds + 60
        while producer.is_alive():
            check()
            progress.update(written.value, received.value)
            if time.monotonic() > deadline:
                raise RuntimeError(f"the writer for {topic} did not finish in time")
            time.sleep(0.2)
        if producer.exitcode != 0:
            raise RuntimeError(f"the writer for {topic} failed (exit {producer.exitcode})")
        deadline = time.monotonic() + drain_timeout
        while received.value < written.value and time.monotonic() < deadline:
            check()
            progress.update(written.value, received.value)
            time.sleep(0.05)
        progress.update(written.value, received.value)
    finally:
        stop.set()
        finish(consumer)
        if producer is not None:
            finish(producer)
    sent = pickle.loads(commits_path.read_bytes())
    got = pickle.loads(receipts_path.read_bytes())
    stats = latency_stats(sent["commits"], got["receipts"])
    stats.update(duplicates=got["duplicates"], achieved_eps=round(sent["achieved_eps"], 1),
                 writer_behind_max_s=round(sent["behind_max_s"], 4))
    return stats
