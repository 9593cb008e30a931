"""Metrics collectors, health rules and the HTTP endpoint, over plain stats (no services)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from cdc_relay.config import MetricsConfig
from cdc_relay.errors import ConfigError, ServiceUnavailable
from cdc_relay.model import Lsn, SlotStatus
from cdc_relay.ops.metrics.collectors import PollCollector, WalCollector, make_registry
from cdc_relay.ops.metrics.endpoint import (
    Endpoints,
    MetricsServer,
    SlotLagProbe,
    poll_health,
    poll_ready,
    wal_health,
    wal_ready,
)
from cdc_relay.polling.settlement import Completion, Settlement
from cdc_relay.stats import BATCH_BUCKETS, PollStats, RelayStats
from tests.support import http_get

SLOT = SlotStatus(name="cdc_relay", plugin="wal2json", slot_type="logical", database="app",
                  active=True, active_pid=42, confirmed_flush_lsn=Lsn(100), restart_lsn=Lsn(50),
                  lag_bytes=1234, lag_seconds=0.5, retained_bytes=4321, wal_status="reserved",
                  safe_wal_size=None)


class FakeReader:
    """A SlotReader whose answers the test scripts: a SlotStatus, None, or an exception."""

    def __init__(self, *answers: SlotStatus | Exception | None) -> None:
        self.answers = list(answers)
        self.closed = False

    def read(self) -> SlotStatus | None:
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def close(self) -> None:
        self.closed = True


def samples(collector: object) -> dict[str, float]:
    """``{"name{label=value}": value}`` of everything the collector exports."""
    text = generate_latest(make_registry(collector)).decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            out[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return out


def probe_with(*answers: SlotStatus | Exception | None) -> SlotLagProbe:
    probe = SlotLagProbe(FakeReader(*answers))  # type: ignore[arg-type]
    for _ in answers:
        probe.sample()
    return probe


def test_wal_collector_reads_the_loop_counters_at_scrape_time() -> None:
    stats = RelayStats(published=7, dead_lettered=2, failed_by_type={"OrderPlaced": 3},
                       inflight=5, confirmed_lsn=123456, streaming=True, restarts=1)
    collector = WalCollector(stats, probe_with(SLOT))
    first = samples(collector)
    assert first["outbox_events_published_total"] == 7
    assert first["outbox_events_failed_total{event_type=OrderPlaced}"] == 3
    assert first["outbox_dead_letters"] == 2
    assert first["cdc_relay_inflight_events"] == 5
    assert first["cdc_relay_confirmed_lsn"] == 123456
    assert first["cdc_relay_restarts_total"] == 1
    assert first["cdc_relay_slot_lag_bytes"] == 1234
    assert first["cdc_relay_replication_lag_seconds"] == 0.5
    assert first["cdc_relay_wal_retained_bytes"] == 4321
    assert first["cdc_relay_slot_probe_success"] == 1
    stats.published = 9
    assert samples(collector)["outbox_events_published_total"] == 9


def test_lag_gauges_disappear_while_the_probe_cannot_read(caplog: pytest.LogCaptureFixture) -> None:
    down = ServiceUnavailable("cannot connect to PostgreSQL at h:5432/app: refused")
    with caplog.at_level(logging.INFO, logger="cdc_relay.metrics"):
        probe = probe_with(SLOT, down, down, down)
    values = samples(WalCollector(RelayStats(), probe))
    assert values["cdc_relay_slot_probe_success"] == 0
    assert "cdc_relay_slot_lag_bytes" not in values
    # One warning per outage, not one per probe.
    assert sum("slot lag probe" in r.getMessage() for r in caplog.records) == 1
    probe._reader.answers.append(SLOT)  # type: ignore[attr-defined]
    probe.sample()
    assert samples(WalCollector(RelayStats(), probe))["cdc_relay_slot_lag_bytes"] == 1234


def test_no_slot_means_no_lag_gauges_but_a_successful_probe() -> None:
    values = samples(WalCollector(RelayStats(), probe_with(None)))
    assert values["cdc_relay_slot_probe_success"] == 1
    assert "cdc_relay_slot_lag_bytes" not in values


def test_poll_collector_exports_backlog_and_the_batch_histogram() -> None:
    stats = PollStats(pending=12, dead_letters=3)
    empty = Settlement([], [], [], broker_down=False, discard_sink=False)
    for duration in (0.004, 0.2, 0.2, 120.0):
        stats.record(empty, Completion(processed=10, failed=0, dead_lettered=()), duration)
    values = samples(PollCollector(stats))
    assert values["outbox_events_published_total"] == 40
    assert values["outbox_events_pending"] == 12
    assert values["outbox_dead_letters"] == 3
    assert values["outbox_batch_duration_seconds_count"] == 4
    assert values["outbox_batch_duration_seconds_sum"] == pytest.approx(120.404)
    assert values["outbox_batch_duration_seconds_bucket{le=0.005}"] == 1
    assert values["outbox_batch_duration_seconds_bucket{le=0.25}"] == 3
    assert values[f"outbox_batch_duration_seconds_bucket{{le={BATCH_BUCKETS[-1]}}}"] == 3
    assert values["outbox_batch_duration_seconds_bucket{le=+Inf}"] == 4


def test_wal_health_fails_only_when_a_streaming_loop_stops_turning() -> None:
    stats = RelayStats(streaming=True, last_tick=100.0, producer_ok=True)
    assert wal_health(stats, now=110.0)[0]
    assert not wal_health(stats, now=200.0)[0]
    standby = RelayStats(streaming=False, last_tick=0.0)
    assert wal_health(standby, now=10_000.0)[0]  # waiting for a busy slot is alive
    assert wal_ready(stats)[0]
    assert wal_ready(standby) == (False, "not ready: no usable producer (no broker answered, "
                                         "or the producer failed)")
    warm_standby = RelayStats(streaming=False, producer_ok=True)
    assert wal_ready(warm_standby) == (False, "not ready: the replication stream is not open")
    ok, reason = wal_ready(RelayStats(streaming=True, producer_ok=False))
    assert not ok and "producer" in reason


def test_poll_health_and_readiness() -> None:
    stats = PollStats(last_tick=0.0, connected=False)
    assert poll_health(stats, now=50.0, started=0.0, stale_after=90.0)[0]  # starting up
    assert not poll_health(stats, now=500.0, started=0.0, stale_after=90.0)[0]
    assert not poll_ready(stats)[0]
    stats.connected, stats.last_tick = True, 490.0
    assert poll_health(stats, now=500.0, started=0.0, stale_after=90.0)[0]
    assert poll_ready(stats)[0]
    stats.broker_ok = False
    assert not poll_ready(stats)[0]


@pytest.fixture
def wal_stats() -> RelayStats:
    return RelayStats(published=3, streaming=True, producer_ok=True, last_tick=0.0)


@pytest.fixture
def server(wal_stats: RelayStats) -> Iterator[MetricsServer]:
    clock = {"now": 1.0}
    endpoints = Endpoints(make_registry(WalCollector(wal_stats, None)),
                          health=lambda: wal_health(wal_stats, clock["now"]),
                          ready=lambda: wal_ready(wal_stats))
    server = MetricsServer(MetricsConfig(port=0), endpoints)
    server.start()
    try:
        yield server
    finally:
        server.close()


def get(server: MetricsServer, path: str) -> tuple[int, str]:
    return http_get(server.port, path)


def test_http_endpoint_serves_metrics_health_and_readiness_without_access_lines(
        server: MetricsServer, wal_stats: RelayStats, capfd: pytest.CaptureFixture[str]) -> None:
    code, body = get(server, "/metrics")
    assert code == 200 and "outbox_events_published_total 3.0" in body
    assert get(server, "/healthz")[0] == 200
    assert get(server, "/readyz")[0] == 200
    wal_stats.producer_ok = False
    code, body = get(server, "/readyz")
    assert code == 503 and "producer" in body
    wal_stats.last_tick = -100.0  # streaming, but the loop stopped turning
    code, body = get(server, "/healthz")
    assert code == 503 and "stuck" in body
    assert get(server, "/nope")[0] == 404
    assert capfd.readouterr().err == ""  # http.server's access lines would break JSON logs


def test_a_taken_port_is_a_one_line_config_error(server: MetricsServer) -> None:
    endpoints = Endpoints(make_registry(), health=lambda: (True, ""), ready=lambda: (True, ""))
    with pytest.raises(ConfigError, match="choose another --metrics-port"):
        MetricsServer(MetricsConfig(port=server.port), endpoints)


def test_wal_collector_counts_delivery_retries_by_reason() -> None:
    stats = RelayStats(retries_by_reason={"topic_missing": 3, "producer_failed": 1})
    values = samples(WalCollector(stats, None))
    assert values["cdc_relay_delivery_retries_total{reason=topic_missing}"] == 3
    assert values["cdc_relay_delivery_retries_total{reason=producer_failed}"] == 1
