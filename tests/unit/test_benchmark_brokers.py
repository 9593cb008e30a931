"""The benchmark's ``--broker`` choice (benchmarks/brokers.py) and how a run records it."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.__main__ import build_plan
from benchmarks.brokers import (
    BROKERS,
    DEFAULT_BROKER,
    broker_label,
    broker_line,
    describe,
    new_broker,
)
from cdc_relay.local.apache_kafka import FAST_START_FLAG, ApacheKafka, jvm_command
from cdc_relay.local.broker import Broker


def test_apache_kafka_is_the_default_and_tansu_the_other_choice() -> None:
    assert DEFAULT_BROKER == "kafka" and BROKERS == ("kafka", "tansu")
    plan = build_plan(Path("/tmp/x"), False, False, None, None, None, None, None, ())
    assert plan.broker == "kafka"
    tansu = build_plan(Path("/tmp/x"), True, False, None, None, None, None, None, (), broker="tansu")
    assert tansu.broker == "tansu" and tansu.label == "quick", "the broker is no custom workload"
    assert plan.broker_warmup == 1, "one message gets a fresh broker's start over"
    warm = build_plan(Path("/tmp/x"), True, False, None, None, None, None, None, (), broker_warmup=50_000)
    assert warm.broker_warmup == 50_000


def test_a_fresh_broker_of_each_kind_is_not_started_yet() -> None:
    kafka = new_broker("kafka")
    assert isinstance(kafka, ApacheKafka) and kafka.version == "4.1.2" and kafka.pid is None
    assert isinstance(new_broker("tansu"), Broker)
    with pytest.raises(ValueError, match="known: kafka, tansu"):
        new_broker("redpanda")


def test_the_benchmark_broker_runs_with_the_full_jit() -> None:
    kafka = new_broker("kafka")
    assert isinstance(kafka, ApacheKafka)
    assert kafka._fast_start is False  # the one setting that matters here
    assert FAST_START_FLAG not in jvm_command("java", Path("/lib"), "kafka.Kafka", fast_start=False)


def test_results_name_the_broker_kind_and_version() -> None:
    kafka = describe("kafka")
    assert (kafka["kind"], kafka["name"], kafka["version"]) == ("kafka", "Apache Kafka", "4.1.2")
    assert broker_label({"broker": kafka}) == "Apache Kafka 4.1.2"
    assert broker_line({"broker": kafka}).startswith("Apache Kafka 4.1.2, single-node KRaft")
    tansu = describe("tansu", "tansu 0.6.0")
    assert (tansu["kind"], tansu["version"], tansu["label"]) == ("tansu", "0.6.0", "tansu 0.6.0")
    assert "memory only" in broker_line({"broker": tansu})
    with pytest.raises(ValueError):
        describe("redpanda")


def test_a_run_from_before_the_choice_was_on_tansu() -> None:
    old = {"machine": {"broker": "tansu 0.6.0"}}
    assert broker_label(old) == "tansu 0.6.0"
    assert broker_line(old) == "tansu 0.6.0, memory only (nothing on disk)"
