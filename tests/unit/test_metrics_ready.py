"""``cdc_relay_ready``: the /readyz verdict as a gauge, so that alert rules can see readiness."""

from __future__ import annotations

import urllib.error
import urllib.request

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from cdc_relay.config import MetricsConfig
from cdc_relay.ops.metrics.collectors import ReadyCollector, make_registry
from cdc_relay.ops.metrics.endpoint import serve_poll
from cdc_relay.stats import PollStats


def ready_value(text: str) -> float:
    (family,) = [f for f in text_string_to_metric_families(text) if f.name == "cdc_relay_ready"]
    (sample,) = family.samples
    return sample.value


def test_the_gauge_follows_the_verdict() -> None:
    verdict = [(False, "not ready: waiting for the broker")]
    registry = make_registry(ReadyCollector(lambda: verdict[0]))
    assert ready_value(generate_latest(registry).decode()) == 0
    verdict[0] = (True, "ready: polling")
    assert ready_value(generate_latest(registry).decode()) == 1


def test_the_poll_endpoint_exports_what_readyz_answers() -> None:
    stats = PollStats()
    with serve_poll(MetricsConfig(port=0), stats, interval=1.0) as server:
        assert server is not None

        def get(path: str) -> tuple[int, str]:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{server.port}{path}", timeout=5) as reply:
                    return reply.status, reply.read().decode()
            except urllib.error.HTTPError as exc:
                return exc.code, exc.read().decode()

        assert get("/readyz")[0] == 503
        assert ready_value(get("/metrics")[1]) == 0
        with stats.lock:
            stats.connected = stats.broker_ok = True
        assert get("/readyz")[0] == 200
        assert ready_value(get("/metrics")[1]) == 1
