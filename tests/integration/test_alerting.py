"""The operator kit against a real Prometheus: the alert rules fire on a frozen broker, and
every series the rules and the dashboard use exists in the relays' output.

One test, to keep the services' start-up paid once: a WAL relay and a poller (on one
database, both with ``--metrics-port``), Debian's ``prometheus`` scraping both every
second with the shipped rules whose durations are scaled down (a minute becomes 2 s,
``tests.monitoring.fast_rules``; thresholds stay as shipped). Freezing the broker leaves
events in flight with no acknowledgement: CdcRelayWalStalled goes pending, then fires.
That is the alert this proves live because it needs no volume: the lag alerts' thresholds
(64 MiB, 1 GiB, 60 s) are sized for production, and their timing is proven by promtool
(tests/unit/prometheus/alerts.test.yml).
"""

from __future__ import annotations

import re
import time
import urllib.request
from datetime import datetime

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from cdc_relay.local.broker import Broker
from cdc_relay.local.helpers import free_port
from cdc_relay.outbox import emit
from tests.integration.wal_support import init_db, start_relay
from tests.monitoring import (
    PROMETHEUS_SERIES,
    PrometheusServer,
    PromQLError,
    dashboard_queries,
    expand_grafana,
    fast_rules,
    load_dashboard,
    rule_and_dashboard_metrics,
)
from tests.support import CliProcess, wait_for

# Series the rules or the dashboard use that neither relay here can export, and why;
# tests/unit/test_alert_rules.py checks that the relay's code defines them.
NOT_HERE = {
    "cdc_relay_transaction_open_age_seconds": "only with run --exactly-once",
    "cdc_relay_slot_safe_wal_size_bytes": "only with max_slot_wal_keep_size set on the server",
    "cdc_relay_slot_failover_ready": "only with --standby-dsn (test_ha_operations.py)",
    "cdc_relay_failover_probe_success": "only with --standby-dsn (test_ha_operations.py)",
    "cdc_relay_slot_inactive_seconds": "only on PostgreSQL 17+, while the slot is inactive "
                                       "(test_idle_slot_timeout.py)",
    "cdc_relay_slot_idle_timeout_seconds": "only on PostgreSQL 18 (test_idle_slot_timeout.py)",
}
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"),
            "summary": ("_sum", "_count", "")}


def exported_series(port: int) -> set[str]:
    """The series names a ``/metrics`` endpoint exports, families without samples included
    (``outbox_events_failed_total`` has none until an event fails)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    names = set()
    for family in text_string_to_metric_families(text):
        names.update(family.name + suffix for suffix in SUFFIXES.get(family.type, ("",)))
        names.update(sample.name for sample in family.samples)
    return names


def unix_time(rfc3339: str) -> float:
    """Prometheus's timestamps (nanoseconds, ``Z`` or an offset) as Unix time."""
    match = re.fullmatch(r"([^.Z+]+)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)", rfc3339)
    assert match, rfc3339
    base, fraction, zone = match.groups()
    moment = datetime.fromisoformat(base + ("+00:00" if zone == "Z" else zone))
    return moment.timestamp() + float(f"0.{fraction or 0}")


def rules_evaluated_since(prom: PrometheusServer, since: float) -> bool:
    """Every rule group has been evaluated after ``since`` (a Unix time)."""
    groups = prom.api("rules")["groups"]
    return bool(groups) and all(unix_time(group["lastEvaluation"]) > since for group in groups)


def assert_used_series_exported(*ports: int) -> None:
    """No typo'd series: everything the rules and the dashboard select is exported here."""
    exported = set().union(*(exported_series(port) for port in ports))
    missing = {name: sorted(where) for name, where in rule_and_dashboard_metrics().items()
               if name not in exported | PROMETHEUS_SERIES | set(NOT_HERE)}
    assert not missing, f"used but exported by neither relay: {missing}"
    assert not set(NOT_HERE) & exported, "listed as absent here, but exported: update NOT_HERE"


def assert_rules_healthy(prom: PrometheusServer) -> None:
    """Every rule has been evaluated on the data scraped so far, without error."""
    scraped = time.time()
    wait_for(lambda: rules_evaluated_since(prom, scraped), timeout=20, message="rules evaluated")
    for group in prom.api("rules")["groups"]:
        for rule in group["rules"]:
            assert rule["health"] == "ok", (rule["name"], rule.get("lastError"))


def assert_dashboard_evaluates(prom: PrometheusServer) -> None:
    """Every panel's query evaluates, over a range as Grafana asks for it."""
    now = time.time()
    failed = []
    for title, expr in dashboard_queries(load_dashboard()):
        try:
            prom.api("query_range", query=expand_grafana(expr), start=str(now - 30),
                     end=str(now), step="1")
        except PromQLError as exc:
            failed.append(f"{title}: {exc}")
    assert not failed, failed


@pytest.mark.slow  # a live Prometheus waits for its alert
def test_a_frozen_broker_fires_the_stall_alert_and_every_used_series_exists(
        db: str, private_broker: Broker, topic_prefix: str) -> None:
    init_db(db)
    wal_port, poll_port = free_port(), free_port()
    poll_args = ["poll", "--dsn", db, "--brokers", private_broker.bootstrap,
                 "--metrics-port", str(poll_port), "--topic-pattern", topic_prefix + ".{aggregate_type}",
                 "--interval", "200ms", "--no-notify", "--message-timeout", "10s"]
    jobs = {"cdc-relay": [f"127.0.0.1:{wal_port}"], "cdc-relay-poll": [f"127.0.0.1:{poll_port}"]}
    with CliProcess(poll_args) as poller, \
            start_relay(db, private_broker.bootstrap, topic_prefix,
                        extra=("--metrics-port", str(wal_port))) as relay, \
            PrometheusServer(jobs, fast_rules(seconds_per_minute=2)) as prom:
        wait_for(lambda: [r["value"][1] for r in prom.query("cdc_relay_ready")] == ["1", "1"],
                 timeout=30, message=f"both relays scraped and ready\n{poller.stderr}\n{prom.log}")
        assert_used_series_exported(wal_port, poll_port)
        assert_rules_healthy(prom)
        assert "CdcRelayWalStalled" not in prom.alert_states()

        private_broker.pause()
        try:
            with psycopg.connect(db) as conn:
                for n in range(5):
                    emit(conn, "order", f"o-{n}", "OrderPlaced", {"n": n})
            wait_for(lambda: "firing" in prom.alert_states().get("CdcRelayWalStalled", set()),
                     timeout=40, interval=0.2, message=f"CdcRelayWalStalled firing\n{relay.stderr}")
            # It went through pending first: Prometheus recorded the state itself.
            pending = prom.query('max_over_time(ALERTS{alertname="CdcRelayWalStalled",'
                                 'alertstate="pending",job="cdc-relay"}[1m])')
            assert [r["metric"]["job"] for r in pending] == ["cdc-relay"]
            # (the relay replaces its producer after --message-timeout: look back a minute)
            inflight = prom.query('max_over_time(cdc_relay_inflight_events{job="cdc-relay"}[1m])')
            assert float(inflight[0]["value"][1]) > 0
            assert_dashboard_evaluates(prom)
        finally:
            private_broker.resume()
