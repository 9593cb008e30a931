"""docker/: no container engine here, so check the files against the CLI they drive.

Every ``cdc-relay`` command, ``--option`` and ``CDC_RELAY_*`` variable the compose file
uses must exist in the click CLI (and parse: the values are run through click's own
parser with that environment), the relay image must run as a non-root user, PostgreSQL
must come up with logical WAL and wal2json, Kafka in KRaft mode.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import click
import pytest
import yaml

from cdc_relay import accel
from cdc_relay.cli.main import cli

DOCKER = Path(__file__).resolve().parents[2] / "docker"
COMPOSE = yaml.safe_load((DOCKER / "compose.yaml").read_text(encoding="utf-8"))
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]


def relay_services() -> dict[str, dict[str, Any]]:
    """Services that run the relay image (built from docker/Dockerfile)."""
    return {name: service for name, service in SERVICES.items()
            if isinstance(service.get("build"), dict)
            and service["build"].get("dockerfile") == "docker/Dockerfile"}


def resolve(args: list[str]) -> tuple[click.Command, list[str]]:
    """The (sub)command ``args`` names and the arguments left for it."""
    command: click.Command = cli
    rest = list(args)
    while isinstance(command, click.Group) and rest and not rest[0].startswith("-"):
        sub = command.commands.get(rest[0])
        assert sub is not None, f"no command {rest[0]!r} in `cdc-relay {' '.join(args)}`"
        command, rest = sub, rest[1:]
    assert not isinstance(command, click.Group), f"`cdc-relay {' '.join(args)}` names a group"
    return command, rest


def option_names(command: click.Command) -> set[str]:
    return {name for p in command.params if isinstance(p, click.Option)
            for name in (*p.opts, *p.secondary_opts)}


def envvars(command: click.Command) -> set[str]:
    return {p.envvar for p in command.params if isinstance(p.envvar, str)} | {"CDC_RELAY_CONFIG"}


def test_the_compose_file_runs_init_and_the_relay() -> None:
    commands = {name: service["command"][0] for name, service in relay_services().items()}
    assert commands["init"] == "init"
    assert commands["relay"] == "run"
    depends = SERVICES["relay"]["depends_on"]
    assert depends["init"]["condition"] == "service_completed_successfully"


@pytest.mark.parametrize("name", sorted(relay_services()))
def test_commands_options_and_environment_exist_in_the_cli(
        name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    service = relay_services()[name]
    command, rest = resolve([str(arg) for arg in service["command"]])
    for arg in rest:
        if arg.startswith("--"):
            assert arg.split("=")[0] in option_names(command), f"{name}: unknown option {arg}"
    environment = {str(k): str(v) for k, v in (service.get("environment") or {}).items()}
    ours = {k for k in environment if k.startswith("CDC_RELAY_")}
    assert ours <= envvars(command), f"{name}: {sorted(ours - envvars(command))} map to no option"
    # And the values parse, through click's own env var handling.
    for key in [k for k in os.environ if k.startswith("CDC_RELAY_")]:
        monkeypatch.delenv(key)
    for key, value in environment.items():
        monkeypatch.setenv(key, value)
    command.make_context(name, list(rest))


def test_the_metrics_port_is_published_and_reachable_from_outside_the_container() -> None:
    relay = SERVICES["relay"]
    env = relay["environment"]
    port = str(env["CDC_RELAY_METRICS_PORT"])
    assert env["CDC_RELAY_METRICS_HOST"] == "0.0.0.0"
    assert any(str(p).endswith(f":{port}") for p in relay["ports"])
    assert f":{port}/healthz" in " ".join(relay["healthcheck"]["test"])


def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", path.read_text(encoding="utf-8"))
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "")
            for line in (raw.strip() for raw in text.splitlines())
            if line and not line.startswith("#")]


def test_the_relay_image_is_slim_and_runs_as_a_non_root_user() -> None:
    instructions = dockerfile_instructions(DOCKER / "Dockerfile")
    froms = [arg for op, arg in instructions if op == "FROM"]
    assert froms[-1].startswith("python:3.11-slim")
    users = [arg for op, arg in instructions if op == "USER"]
    assert users, "no USER: the image would run as root"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0")
    entrypoint = [arg for op, arg in instructions if op == "ENTRYPOINT"][-1]
    assert "cdc-relay" in entrypoint
    assert any(op == "RUN" and "pip install" in arg for op, arg in instructions)


def test_the_relay_image_carries_every_compiled_extension_but_no_compiler() -> None:
    instructions = dockerfile_instructions(DOCKER / "Dockerfile")
    stages = [i for i, (op, _) in enumerate(instructions) if op == "FROM"]
    build, image = instructions[stages[-2]:stages[-1]], instructions[stages[-1]:]
    assert any(op == "COPY" and "setup.py" in arg for op, arg in build)
    assert any(op == "RUN" and "gcc" in arg for op, arg in build)
    assert not any(op == "RUN" and "gcc" in arg for op, arg in image)
    installs = " ".join(arg for op, arg in image if op == "RUN")
    assert "pip install /wheels/" in installs
    built = re.findall(r'Extension\("([\w.]+)"', (DOCKER.parent / "setup.py").read_text())
    assert set(built) == set(accel.EXTENSIONS.values())  # the switch knows each one
    checked = re.search(r'python -c "import ([\w., ]+)"', installs)
    assert checked is not None and set(checked.group(1).split(", ")) == set(built)


def test_postgres_has_logical_wal_and_wal2json() -> None:
    postgres = SERVICES["postgres"]
    command = " ".join(str(part) for part in postgres["command"])
    assert "wal_level=logical" in command
    assert "max_replication_slots=" in command and "max_wal_senders=" in command
    image = dockerfile_instructions(DOCKER / postgres["build"] / "Dockerfile")
    assert [arg for op, arg in image if op == "FROM"][-1].startswith("postgres:15")
    assert any(op == "RUN" and "wal2json" in arg for op, arg in image)
    # Allowed where the server knows output_plugin_libraries (15.19+), never forced on
    # older minors that would refuse to start with the unknown setting.
    assert any(op == "RUN" and "grep -q" in arg and "output_plugin_libraries" in arg
               for op, arg in image)
    assert "output_plugin_libraries" not in command


def test_kafka_runs_in_kraft_mode() -> None:
    env = SERVICES["kafka"]["environment"]
    assert "controller" in env["KAFKA_PROCESS_ROLES"]
    assert "KAFKA_ZOOKEEPER_CONNECT" not in env
    listeners = env["KAFKA_ADVERTISED_LISTENERS"]
    brokers = SERVICES["relay"]["environment"]["CDC_RELAY_BROKERS"]
    assert f"//{brokers}" in listeners
