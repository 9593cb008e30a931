"""The Grafana dashboard (docker/grafana/dashboards/cdc-relay.json): importable, complete, and
its threshold lines are the alert rules' thresholds.

Every query is evaluated on a real Prometheus by tests/integration/test_alerting.py.
"""

from __future__ import annotations

import re

import pytest

from tests.monitoring import (
    dashboard_panels,
    dashboard_queries,
    expand_grafana,
    load_dashboard,
    load_rules,
    metric_names,
)

DASHBOARD = load_dashboard()
PANELS = {panel["title"]: panel for panel in dashboard_panels(DASHBOARD)}
RULES = {rule["alert"]: rule for rule in load_rules()}

# What the operator must find on it: a panel title -> a series its queries must select.
REQUIRED = {
    "Published events/s": "outbox_events_published_total",
    "Slot lag (bytes)": "cdc_relay_slot_lag_bytes",
    "Replication lag (seconds)": "cdc_relay_replication_lag_seconds",
    "In-flight events": "cdc_relay_inflight_events",
    "Confirmed LSN progress (bytes/s)": "cdc_relay_confirmed_lsn",
    "Dead letters": "outbox_dead_letters",
    "Batch duration": "outbox_batch_duration_seconds_bucket",
    "Failed delivery attempts/s by event type": "outbox_events_failed_total",
    "Pending outbox rows": "outbox_events_pending",
    "Open Kafka transaction age (exactly-once)": "cdc_relay_transaction_open_age_seconds",
    "Slot wal_status and failover readiness": "cdc_relay_slot_failover_ready",
}

# Panel -> the lines it draws and the alert each comes from. Grafana colours a value at or
# above a step; for "> 0" of a count that is the first dead letter (1).
LINES = {
    "Slot lag (bytes)": {67108864: "CdcRelaySlotLagGrowing", 1073741824: "CdcRelaySlotLagHigh"},
    "Replication lag (seconds)": {10: "CdcRelayReplicationLagGrowing", 60: "CdcRelayReplicationLagHigh"},
    "Batch duration": {5: "CdcRelaySlowBatches"},
    "Pending outbox rows": {1000: "CdcRelayOutboxBacklog"},
    "Open Kafka transaction age (exactly-once)": {30: "CdcRelayTransactionOpenTooLong"},
    "Streaming, slot active, restarts": {3: "CdcRelayRestarting"},
    "Dead letters": {1: "CdcRelayDeadLetters"},
    "Dead letters now": {1: "CdcRelayDeadLetters"},
}


def test_the_dashboard_is_importable() -> None:
    assert DASHBOARD["uid"] == "cdc-relay" and DASHBOARD["title"]
    assert isinstance(DASHBOARD["schemaVersion"], int)
    assert "id" not in DASHBOARD or DASHBOARD["id"] is None, "an id would clash on import"
    variables = {v["name"]: v for v in DASHBOARD["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = [panel["id"] for panel in DASHBOARD["panels"]]
    assert len(ids) == len(set(ids))
    titles = [panel["title"] for panel in dashboard_panels(DASHBOARD)]
    assert len(titles) == len(set(titles))


@pytest.mark.parametrize("panel", list(PANELS.values()), ids=list(PANELS))
def test_every_panel_queries_the_chosen_prometheus(panel: dict[str, object]) -> None:
    assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
    targets = panel["targets"]
    assert isinstance(targets, list) and targets
    for target in targets:
        assert target["datasource"] == panel["datasource"]
        expand_grafana(target["expr"])  # only variables the dashboard defines


@pytest.mark.parametrize(("title", "series"), sorted(REQUIRED.items()))
def test_the_dashboard_shows_what_an_operator_needs(title: str, series: str) -> None:
    selected = set().union(*(metric_names(t["expr"]) for t in PANELS[title]["targets"]))
    assert series in selected


def compares_with(expr: str, value: float) -> bool:
    """The rule's condition is ``... > value`` (the number whole, not a prefix of another)."""
    return re.search(rf">\s*{int(value)}(?![\d.e])", expr) is not None


@pytest.mark.parametrize(("title", "lines"), sorted(LINES.items()))
def test_threshold_lines_are_the_alert_thresholds(title: str, lines: dict[float, str]) -> None:
    defaults = PANELS[title]["fieldConfig"]["defaults"]
    steps = [step["value"] for step in defaults["thresholds"]["steps"] if step["value"] is not None]
    assert sorted(steps) == sorted(lines)
    if PANELS[title]["type"] == "timeseries":
        assert defaults["custom"]["thresholdsStyle"]["mode"] in ("line", "dashed", "line+area")
    for value, alert in lines.items():
        expr = RULES[alert]["expr"]
        expected = 0 if alert == "CdcRelayDeadLetters" else value  # > 0 of a count: line at 1
        assert compares_with(expr, expected), (alert, expr)


def test_the_panels_use_only_the_variables_the_dashboard_defines() -> None:
    names = {v["name"] for v in DASHBOARD["templating"]["list"]}
    for _, expr in dashboard_queries(DASHBOARD):
        for variable in re.findall(r"\$(\w+)", expr):
            assert variable in names or variable.startswith("__"), variable
