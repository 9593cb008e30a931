"""docker/compose.yaml's prometheus and grafana services, checked statically (no container engine).

Prometheus must scrape the relay's published metrics port under the job name the rules
expect and read the shipped rules; Grafana must provision that Prometheus as its data
source and load the shipped dashboard; every file mounted must exist; ports stay on the
host's loopback.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tests.monitoring import DASHBOARD, RULES

DOCKER = Path(__file__).resolve().parents[2] / "docker"
SERVICES: dict[str, dict[str, Any]] = yaml.safe_load(
    (DOCKER / "compose.yaml").read_text(encoding="utf-8"))["services"]


def mounts(service: dict[str, Any]) -> dict[str, Path]:
    """Bind mounts of a service: container path -> host path (named volumes left out)."""
    out = {}
    for volume in service.get("volumes", []):
        source, target = str(volume).split(":")[:2]
        if source.startswith("."):
            out[target] = (DOCKER / source).resolve()
    return out


def container_port(service: dict[str, Any]) -> int:
    (port,) = service["ports"]
    host, _, inner = str(port).rpartition(":")
    assert host.startswith("127.0.0.1:"), f"{port}: publish on the loopback only"
    return int(inner)


def test_prometheus_scrapes_the_relay_with_the_shipped_rules() -> None:
    prometheus = SERVICES["prometheus"]
    flags = dict(str(arg).split("=", 1) for arg in prometheus["command"])
    files = mounts(prometheus)
    config_path = files[flags["--config.file"]]
    assert config_path.is_file()
    config = yaml.safe_load(config_path.read_text(encoding="utf-8"))
    container_dir = Path(flags["--config.file"]).parent
    for rule_file in config["rule_files"]:
        assert files[str(container_dir / rule_file)] == RULES
    (job,) = config["scrape_configs"]
    assert job["job_name"] == "cdc-relay"
    relay_port = SERVICES["relay"]["environment"]["CDC_RELAY_METRICS_PORT"]
    assert job["static_configs"][0]["targets"] == [f"relay:{relay_port}"]
    assert container_port(prometheus) == 9090
    assert "/-/ready" in " ".join(prometheus["healthcheck"]["test"])


def test_grafana_provisions_prometheus_and_the_dashboard() -> None:
    grafana = SERVICES["grafana"]
    files = mounts(grafana)
    provisioning = files["/etc/grafana/provisioning"]
    datasources = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())
    (source,) = datasources["datasources"]
    assert source["type"] == "prometheus" and source["isDefault"] is True
    assert source["url"] == f"http://prometheus:{container_port(SERVICES['prometheus'])}"
    providers = yaml.safe_load((provisioning / "dashboards" / "cdc-relay.yml").read_text())
    (provider,) = providers["providers"]
    dashboards_dir = provider["options"]["path"]
    assert files[dashboards_dir] == DASHBOARD.parent
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert Path(home).parent == Path(dashboards_dir) and (DASHBOARD.parent / Path(home).name) == DASHBOARD
    assert grafana["depends_on"]["prometheus"]["condition"] == "service_healthy"
    assert container_port(grafana) == 3000


def test_images_are_pinned() -> None:
    for name in ("prometheus", "grafana"):
        image = SERVICES[name]["image"]
        assert ":" in image and not image.endswith(":latest"), image
