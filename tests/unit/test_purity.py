"""The pure modules import neither psycopg nor confluent_kafka (docs/design.md, packages).

Also ``run``'s start-up path: the CLI and WAL mode's composition root import no driver at
module level (the first producer warms up while psycopg is imported).

Checked in a fresh interpreter, so modules the test session already imported cannot hide
an import: a module is pure only if importing it - and everything it imports - loads no
driver.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

PURE_MODULES = (
    "cdc_relay.model",
    "cdc_relay.errors",
    "cdc_relay.config",
    "cdc_relay.logs",
    "cdc_relay.text",
    "cdc_relay.acks",
    "cdc_relay.delivery.watermark",
    "cdc_relay.delivery.engine",
    "cdc_relay.delivery.producer",
    "cdc_relay.routing",
    "cdc_relay.decoding.wal2json",
    "cdc_relay.decoding.wal2json_options",
    "cdc_relay.decoding.pgoutput",
    "cdc_relay.polling.settlement",
    "cdc_relay.ops.doctor.checks",
    "cdc_relay.ops.doctor.facts",
    "cdc_relay.ops.doctor.slot_checks",
    "cdc_relay.ops.metrics.collectors",
    "cdc_relay.wal.stream.loop",
    "cdc_relay.wal.stream.session",
    "cdc_relay.backoff",
    "cdc_relay.stats",
    "cdc_relay.wal.stream.protocol",
    "cdc_relay.sink.base",
    "cdc_relay.sink.transactions",
    "cdc_relay.sink.sqs.config",
    "cdc_relay.sink.sqs.entries",
    "cdc_relay.sink.batches",
    "cdc_relay.wal.exactly_once.checkpoint",
    "cdc_relay.wal.exactly_once.txn_policy",
    "cdc_relay.wal.stream.delivery",
    "cdc_relay.wal.exactly_once.mode",
    "cdc_relay.ops.doctor.exactly_once",
    "cdc_relay.ops.doctor.capture",
    "cdc_relay.ops.failover.facts",
    "cdc_relay.ops.failover.checks",
    "cdc_relay.outbox_core",  # the application side's shared core
    "cdc_relay.cloudevents",
    "cdc_relay.testing",  # the fakes drive the pure loops without a driver
)
DRIVERS = ("psycopg", "confluent_kafka", "boto3", "botocore")

_PROBE = """
import importlib, json, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in {drivers!r})))
"""

ROOT = Path(__file__).resolve().parents[2]


def _drivers_loaded_by(*modules: str) -> list[str]:
    result = subprocess.run(
        [sys.executable, "-c", _PROBE.format(drivers=set(DRIVERS)), *modules],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )
    assert result.returncode == 0, result.stderr
    loaded: list[str] = json.loads(result.stdout)
    return loaded


def test_the_pure_modules_together_load_no_driver() -> None:
    assert _drivers_loaded_by(*PURE_MODULES) == []


@pytest.mark.parametrize("module", PURE_MODULES)
def test_each_pure_module_loads_no_driver(module: str) -> None:
    assert _drivers_loaded_by(module) == []


def test_the_start_up_path_of_run_imports_no_driver_before_the_first_producer() -> None:
    # run_wal creates the first producer and starts its warm-up before it imports the
    # PostgreSQL side, so the two overlap (docs/design.md, WAL mode, start-up): the CLI and
    # the composition root must not import psycopg (or confluent_kafka) at module level.
    assert _drivers_loaded_by("cdc_relay.cli.main", "cdc_relay.app.run") == []


def test_the_probe_would_see_a_driver() -> None:
    assert "psycopg" in _drivers_loaded_by("cdc_relay.pg.db")
    assert "confluent_kafka" in _drivers_loaded_by("cdc_relay.sink.kafka.sink")


def test_the_kafka_sink_brings_what_warm_up_needs_so_no_thread_imports_it_later() -> None:
    # list_topics (KafkaSink.warm_up) builds its answer from confluent_kafka.admin's
    # classes; importing it with the sink keeps it off the warm-up thread, which would
    # otherwise import it while the main thread imports psycopg (docs/design.md, start-up).
    assert "confluent_kafka.admin" in _drivers_loaded_by("cdc_relay.sink.kafka.sink")
