"""The shipped alert rules (docker/prometheus/alerts.yml), checked and unit-tested by promtool.

``promtool test rules`` runs tests/unit/prometheus/alerts.test.yml: synthetic series and
the minute each alert fires. The rest are static checks that need no server: every rule
is proven to fire, says what to check first, and selects only series the relay defines.
The live check against a real Prometheus is tests/integration/test_alerting.py.
"""

from __future__ import annotations

import re
import subprocess

import pytest
import yaml

from tests.monitoring import (
    PROMETHEUS_SERIES,
    ROOT,
    RULE_TESTS,
    RULES,
    fast_rules,
    load_rules,
    metric_names,
    prometheus_binary,
    rule_and_dashboard_metrics,
    scale_duration,
)

COMPOSE_PROMETHEUS = ROOT / "docker" / "prometheus" / "prometheus.yml"
# Metrics that exist only with `run --exactly-once` (and the option that enables them).
EXACTLY_ONCE_ONLY = {"cdc_relay_transaction_open_age_seconds"}


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([prometheus_binary("promtool"), *args], capture_output=True, text=True,
                          timeout=60, check=False, cwd=ROOT)


def test_promtool_accepts_the_rules_and_the_compose_config() -> None:
    rules = promtool("check", "rules", str(RULES))
    assert rules.returncode == 0, rules.stdout + rules.stderr
    assert f"SUCCESS: {len(load_rules())} rules found" in rules.stdout
    config = promtool("check", "config", str(COMPOSE_PROMETHEUS))
    assert config.returncode == 0, config.stdout + config.stderr


def test_promtool_unit_tests_of_the_rules_pass() -> None:
    result = promtool("test", "rules", str(RULE_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_is_proven_to_fire_and_names_are_unique() -> None:
    names = [rule["alert"] for rule in load_rules()]
    assert len(names) == len(set(names))
    spec = yaml.safe_load(RULE_TESTS.read_text(encoding="utf-8"))
    fired = {case["alertname"] for test in spec["tests"] for case in test["alert_rule_test"]
             if case.get("exp_alerts")}
    assert fired == set(names), f"never shown firing: {sorted(set(names) - fired)}"


@pytest.mark.parametrize("rule", load_rules(), ids=lambda rule: rule["alert"])
def test_every_alert_says_what_to_check_first(rule: dict[str, object]) -> None:
    labels, annotations = rule["labels"], rule["annotations"]
    assert isinstance(labels, dict) and labels["severity"] in ("warning", "critical")
    assert isinstance(annotations, dict) and annotations["summary"]
    assert "`cdc-relay doctor" in annotations["description"], "the description must name doctor"
    assert str(rule["alert"]).startswith("CdcRelay")


def test_the_exactly_once_rule_says_its_metric_needs_exactly_once() -> None:
    text = RULES.read_text(encoding="utf-8")
    block = text[text.index("alert: CdcRelayTransactionOpenTooLong"):]
    assert "cdc_relay_transaction_open_age_seconds exists only with `run --exactly-once`" in block


def defined_in_package(name: str) -> bool:
    """``name`` (or its family, without the _total/_bucket/... suffix) is a string literal
    somewhere in cdc_relay/."""
    family = re.sub(r"_(total|bucket|sum|count|created)$", "", name)
    literals = {f'"{name}"', f'"{family}"'}
    return any(literal in path.read_text(encoding="utf-8") for path in (ROOT / "cdc_relay").rglob("*.py")
               for literal in literals)


def test_every_series_the_rules_and_dashboard_use_is_defined_by_the_relay() -> None:
    used = rule_and_dashboard_metrics()
    missing = {name: sorted(where) for name, where in used.items()
               if name not in PROMETHEUS_SERIES | EXACTLY_ONCE_ONLY and not defined_in_package(name)}
    assert not missing, f"no collector defines these (typo?): {missing}"
    assert set(used) >= EXACTLY_ONCE_ONLY


def test_the_exactly_once_metric_is_defined_by_the_relay() -> None:
    undefined = [name for name in EXACTLY_ONCE_ONLY if not defined_in_package(name)]
    assert not undefined, f"nothing defines the exactly-once metric {undefined}"


@pytest.mark.parametrize(("expr", "names"), [
    ('up{job=~"cdc-relay.*"} == 0', {"up"}),
    ("max by (job) (cdc_relay_ready and on (job, instance) cdc_relay_streaming) == 0",
     {"cdc_relay_ready", "cdc_relay_streaming"}),
    ("histogram_quantile(0.95, sum by (job, le) (rate(outbox_batch_duration_seconds_bucket[5m]))) > 5",
     {"outbox_batch_duration_seconds_bucket"}),
    ('count by (alertname) (ALERTS{alertname=~"CdcRelay.*", alertstate="firing"})', {"ALERTS"}),
    ("x_total offset 5m > 1e9 or absent(y{a='b c'})", {"x_total", "y"}),
])
def test_metric_names_finds_selectors_not_functions_labels_or_numbers(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


def test_fast_rules_scale_every_duration_and_keep_the_thresholds() -> None:
    assert scale_duration("5m", 2) == "10s"
    assert scale_duration("15m", 2) == "30s"
    assert scale_duration("1h", 2) == "120s"
    with pytest.raises(ValueError, match="single unit"):
        scale_duration("1m30s", 2)
    shipped = {rule["alert"]: rule for rule in load_rules()}
    for group in fast_rules(2)["groups"]:
        for rule in group["rules"]:
            original = shipped[rule["alert"]]
            assert not re.search(r"\[\d+[mhd]\]", rule["expr"]), rule["expr"]
            assert re.sub(r"\[[^\]]*\]", "[]", rule["expr"]) == re.sub(r"\[[^\]]*\]", "[]", original["expr"])
            assert ("for" in rule) == ("for" in original)
            if "for" in rule:
                assert rule["for"].endswith("s")


def test_the_rule_files_are_where_the_compose_prometheus_reads_them() -> None:
    config = yaml.safe_load(COMPOSE_PROMETHEUS.read_text(encoding="utf-8"))
    for rule_file in config["rule_files"]:
        assert (COMPOSE_PROMETHEUS.parent / rule_file).resolve() == RULES
    jobs = [job["job_name"] for job in config["scrape_configs"]]
    assert jobs == ["cdc-relay"], "the rules select jobs named cdc-relay*"
    (tested,) = yaml.safe_load(RULE_TESTS.read_text(encoding="utf-8"))["rule_files"]
    assert (RULE_TESTS.parent / tested).resolve() == RULES
