"""What the benchmark ran on: hardware, versions, load. Reported next to every figure."""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import confluent_kafka
import psycopg

import cdc_relay
from benchmarks.brokers import DEFAULT_BROKER, describe
from cdc_relay.local.helpers import tansu_binary
from cdc_relay.local.postgres import PostgresCluster


def _first_line(cmd: list[str]) -> str:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=False)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip().splitlines()[0]
    return "unknown"


def _meminfo_gib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return round(int(line.split()[1]) / 1024 / 1024, 1)
    return 0.0


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def machine_info(cluster: PostgresCluster, broker: str = DEFAULT_BROKER) -> dict[str, Any]:
    """Hardware and software versions (the cluster must be running); ``broker`` is the run's
    kind (benchmarks/brokers.py): ``broker`` names it, ``tansu`` is Tansu's version line."""
    tansu = _first_line([str(tansu_binary()), "--version"])
    wal2json = _first_line(["dpkg-query", "-W", "-f", "${Version}",
                            f"postgresql-{cluster.version}-wal2json"])
    return {
        "nproc": os.cpu_count(),
        "memory_gib": _meminfo_gib(),
        "cpu": _cpu_model(),
        "kernel": platform.release(),
        "python": sys.version.split()[0],
        "postgresql": cluster.execute("SHOW server_version"),
        "postgresql_settings": cluster.execute(
            "SELECT string_agg(name || '=' || current_setting(name), ', ' ORDER BY name) FROM pg_settings "
            "WHERE name IN ('fsync', 'full_page_writes', 'shared_buffers', 'synchronous_commit', "
            "'wal_level')"),
        "wal2json": wal2json,
        "librdkafka": confluent_kafka.libversion()[0],
        "confluent_kafka": confluent_kafka.__version__,
        "psycopg": psycopg.__version__,
        "broker": describe(broker, tansu)["label"],
        "tansu": tansu,
        "cdc_relay": cdc_relay.__version__,
        "git_commit": _first_line(["git", "-C", str(Path(__file__).parent), "rev-parse", "--short",
                                   "HEAD"]),
    }


def load_average() -> list[float]:
    """The 1, 5 and 15 minute load averages."""
    return [round(x, 2) for x in os.getloadavg()]
