"""Helpers for the operator kit's tests: the alert rules, the dashboard and a real Prometheus.

Owns: finding Debian's ``promtool`` / ``prometheus`` (skipping only when the bootstrap
recorded that it could not install them), reading docker/prometheus/alerts.yml and the
Grafana dashboard, the metric names a PromQL expression selects, a copy of the rules
with every duration scaled down for a live test, and ``PrometheusServer``: a throwaway
server on a free port with its own config and data dir, stopped by PID.

Must not: start the relay or the database (the fixtures and tests/support.py do), or
touch a Prometheus it did not start.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import pytest
import yaml

from cdc_relay.local.helpers import free_port
from cdc_relay.local.registry import track, untrack

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "docker" / "prometheus" / "alerts.yml"
RULE_TESTS = ROOT / "tests" / "unit" / "prometheus" / "alerts.test.yml"
DASHBOARD = ROOT / "docker" / "grafana" / "dashboards" / "cdc-relay.json"
# Written by scripts/bootstrap.sh into the venv when it could not install prometheus.
UNAVAILABLE_MARKER = Path(sys.prefix) / ".prometheus-unavailable"

# Series that Prometheus makes itself, not the relay.
PROMETHEUS_SERIES = frozenset({"up", "ALERTS", "ALERTS_FOR_STATE"})


def prometheus_binary(name: str) -> str:
    """The path of ``promtool`` or ``prometheus``; skip only if the bootstrap could not install it."""
    path = shutil.which(name)
    if path:
        return path
    if UNAVAILABLE_MARKER.exists():
        pytest.skip(f"{name} is not installed ({UNAVAILABLE_MARKER.read_text().strip()}); "
                    "as root: apt-get install --no-install-recommends prometheus")
    pytest.fail(f"{name} is missing: run scripts/bootstrap.sh (make test does), which installs "
                "Debian's prometheus package")


# ---------------------------------------------------------------- rules and dashboard

def load_rules(path: Path = RULES) -> list[dict[str, Any]]:
    """Every rule of the rules file, in order."""
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    return [rule for group in data["groups"] for rule in group["rules"]]


def load_dashboard(path: Path = DASHBOARD) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def dashboard_panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel with queries (rows and nested row panels flattened)."""
    for panel in dashboard["panels"]:
        yield from dashboard_panels({"panels": panel.get("panels", [])})
        if panel.get("type") != "row":
            yield panel


def dashboard_queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """``(panel title, expr)`` of every query of every panel."""
    return [(panel["title"], target["expr"]) for panel in dashboard_panels(dashboard)
            for target in panel.get("targets", [])]


# Grafana's variables, as the live test replaces them (scrapes there are 1 s apart).
GRAFANA_VARIABLES = {"$__rate_interval": "15s", "$job": "cdc-relay.*"}


def expand_grafana(expr: str, variables: dict[str, str] = GRAFANA_VARIABLES) -> str:
    """``expr`` with the dashboard's variables replaced; raises on any variable left over."""
    for name in sorted(variables, key=len, reverse=True):
        expr = expr.replace(name, variables[name])
    if "$" in expr:
        raise ValueError(f"unknown Grafana variable in {expr!r}")
    return expr


# ---------------------------------------------------------------- PromQL metric names

_KEYWORDS = frozenset({"and", "or", "unless", "by", "without", "on", "ignoring", "group_left",
                       "group_right", "bool", "offset", "inf", "nan"})
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_LABEL_LIST = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_MATCHERS = re.compile(r"\{[^}]*\}")
_RANGES = re.compile(r"\[[^\]]*\]")
_IDENT = re.compile(r"(?<![\w.])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?")


def metric_names(expr: str) -> set[str]:
    """The metric names an expression selects (``a{x="y"}``, ``rate(b[5m])``), not functions,
    keywords, label names or numbers. Name-less selectors (``{__name__=...}``) are not used here."""
    text = _STRING.sub('""', expr)
    text = _LABEL_LIST.sub(" ", text)
    text = _MATCHERS.sub(" ", text)
    text = _RANGES.sub(" ", text)
    names = set()
    for match in _IDENT.finditer(text):
        name, call = match.group(1), match.group(2)
        if call or name.lower() in _KEYWORDS or re.fullmatch(r"\d", name[0]):
            continue
        names.add(name)
    return names


def rule_and_dashboard_metrics() -> dict[str, set[str]]:
    """Every metric name the rules and the dashboard select, with where it is used."""
    used: dict[str, set[str]] = {}
    for rule in load_rules():
        for name in metric_names(rule["expr"]):
            used.setdefault(name, set()).add(f"rule {rule['alert']}")
    for title, expr in dashboard_queries(load_dashboard()):
        for name in metric_names(expr):
            used.setdefault(name, set()).add(f"panel {title!r}")
    return used


# ---------------------------------------------------------------- fast rules for a live test

_DURATION = re.compile(r"^(\d+)([smhd])$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def scale_duration(text: str, seconds_per_minute: int) -> str:
    """``5m`` -> ``10s`` with ``seconds_per_minute=2``; every unit scales alike."""
    match = _DURATION.match(text)
    if not match:
        raise ValueError(f"unsupported duration {text!r}: use a single unit, e.g. 5m")
    seconds = int(match.group(1)) * _UNIT_SECONDS[match.group(2)] * seconds_per_minute // 60
    return f"{max(seconds, 1)}s"


def fast_rules(seconds_per_minute: int = 2) -> dict[str, Any]:
    """The shipped rules with every ``for:`` and range selector scaled: a minute becomes
    ``seconds_per_minute`` seconds. Thresholds and expressions stay as shipped."""
    data = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    for group in data["groups"]:
        for rule in group["rules"]:
            rule["expr"] = _RANGES.sub(
                lambda m: f"[{scale_duration(m.group(0)[1:-1], seconds_per_minute)}]", rule["expr"])
            if "for" in rule:
                rule["for"] = scale_duration(str(rule["for"]), seconds_per_minute)
    result: dict[str, Any] = data
    return result


# ---------------------------------------------------------------- a throwaway Prometheus

class PrometheusServer:
    """Debian's ``prometheus`` on a free 127.0.0.1 port, scraping ``jobs`` every ``interval``.

    ``jobs`` maps a job name to its ``host:port`` targets; ``rules`` is a rules document
    (as ``fast_rules`` returns). Config, rules and the TSDB live in a temp dir removed by
    ``stop()``, which ends the process by its PID.
    """

    def __init__(self, jobs: dict[str, list[str]], rules: dict[str, Any], *,
                 interval: str = "1s") -> None:
        self._jobs = jobs
        self._rules = rules
        self._interval = interval
        self._dir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self.port = 0

    def start(self, timeout: float = 30.0) -> Self:
        binary = prometheus_binary("prometheus")
        self._dir = Path(tempfile.mkdtemp(prefix="cdc-relay-prometheus-"))
        track(self)
        (self._dir / "rules.yml").write_text(yaml.safe_dump(self._rules), encoding="utf-8")
        config = {
            "global": {"scrape_interval": self._interval, "evaluation_interval": self._interval,
                       "scrape_timeout": self._interval},
            "rule_files": ["rules.yml"],
            "scrape_configs": [{"job_name": job, "static_configs": [{"targets": targets}]}
                               for job, targets in self._jobs.items()],
        }
        (self._dir / "prometheus.yml").write_text(yaml.safe_dump(config), encoding="utf-8")
        self.port = free_port()
        with open(self._dir / "prometheus.log", "wb") as log:
            self._proc = subprocess.Popen(
                [binary, f"--config.file={self._dir / 'prometheus.yml'}",
                 f"--storage.tsdb.path={self._dir / 'data'}",
                 f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)
        deadline = time.monotonic() + timeout
        while not self._ready():
            if self._proc.poll() is not None or time.monotonic() > deadline:
                log_text = self.log
                self.stop()
                raise RuntimeError(f"prometheus did not become ready:\n{log_text[-2000:]}")
            time.sleep(0.1)
        return self

    @property
    def log(self) -> str:
        if self._dir is None:
            return ""
        return (self._dir / "prometheus.log").read_text(errors="replace")

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2) as reply:
                return bool(reply.status == 200)
        except OSError:
            return False

    def api(self, path: str, **params: str) -> Any:
        """GET ``/api/v1/<path>``; the ``data`` of a success, else raises with Prometheus's error."""
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as reply:
                body = json.loads(reply.read())
        except urllib.error.HTTPError as exc:
            body = json.loads(exc.read() or b"{}")
        if body.get("status") != "success":
            raise PromQLError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector (or other result) of ``expr`` now."""
        result: list[dict[str, Any]] = self.api("query", query=expr)["result"]
        return result

    def alert_states(self) -> dict[str, set[str]]:
        """``{alertname: {"pending", "firing"}}`` of the active alerts."""
        states: dict[str, set[str]] = {}
        for alert in self.api("alerts")["alerts"]:
            states.setdefault(alert["labels"]["alertname"], set()).add(alert["state"])
        return states

    def stop(self) -> None:
        """SIGTERM by PID (SIGKILL after 10 s); remove the temp dir."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(10)
        self._proc = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
        untrack(self)

    def _emergency_stop(self) -> None:
        self.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


class PromQLError(RuntimeError):
    """Prometheus answered a query with an error."""
