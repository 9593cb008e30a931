"""The operator's first day at the CLI: units on durations, the config file's keys and
errors, --config anywhere, ``config show``, secrets from files, the default plugin."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from cdc_relay.cli.config_file import config_first
from cdc_relay.cli.config_show import duration_text
from cdc_relay.cli.main import cli
from cdc_relay.cli.options import run_cli
from cdc_relay.config import ReplicationConfig, parse_duration
from cdc_relay.errors import ConfigError, ExitCode
from cdc_relay.logs import RepeatFilter
from cdc_relay.pg.db import privilege_fix

CLOSED = "host=127.0.0.1 port=1 dbname=x user=u password=hunter2 connect_timeout=2"


def invoke(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = run_cli(cli, args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("text, seconds", [("7d", 604800.0), ("500ms", 0.5), ("0", 0.0),
                                           ("1.5h", 5400.0)])
def test_a_duration_with_a_unit_parses(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


def test_a_bare_number_is_refused_with_an_example(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ConfigError, match=r"a unit is required, e\.g\. 7s or 7d"):
        parse_duration("7")
    code, _, err = invoke(["cleanup", "--dsn", CLOSED, "--older-than", "7"], capsys)
    assert code == ExitCode.USAGE
    assert "7d" in err and len(err.strip().splitlines()) == 1


def test_a_bare_number_in_the_config_file_names_the_file_and_the_key(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "relay.toml"
    config.write_text("[cleanup]\nolder_than = 7\n")
    code, _, err = invoke(["cleanup", "--dsn", CLOSED, "--config", str(config)], capsys)
    assert code == ExitCode.USAGE
    assert f"config file {config}, key [cleanup] older_than:" in err
    assert "a unit is required" in err and "CDC_RELAY" not in err


def test_toml_keys_are_the_option_names_and_old_spellings_warn(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "relay.toml"
    config.write_text('[status]\nformat = "json"\n')
    code, out, err = invoke(["--config", str(config), "config", "show", "status"], capsys)
    assert code == ExitCode.OK, err
    assert next(line for line in out.splitlines() if line.startswith("--format")).split()[1] == "json"
    assert "warning" not in err
    config.write_text('[status]\noutput_format = "json"\n')
    code, out, err = invoke(["--config", str(config), "config", "show", "status"], capsys)
    assert code == ExitCode.OK
    assert "key 'output_format' is an old spelling; use 'format'" in err


def test_config_is_accepted_after_the_subcommand() -> None:
    assert config_first(["run", "--dsn", "x", "--config", "a.toml", "--slot", "s"]) == [
        "--config", "a.toml", "run", "--dsn", "x", "--slot", "s"]
    assert config_first(["poll", "--config=a.toml"]) == ["--config=a.toml", "poll"]
    assert config_first(["run", "--", "--config", "x"]) == ["run", "--", "--config", "x"]


def test_config_show_gives_each_value_its_source_with_secrets_masked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "relay.toml"
    config.write_text('[run]\nslot = "from_file"\n')
    secret = tmp_path / "dsn"
    secret.write_text("postgresql://relay:s3cret@db/shop\n")
    monkeypatch.setenv("CDC_RELAY_DSN_FILE", str(secret))
    monkeypatch.delenv("CDC_RELAY_DSN", raising=False)
    code, out, err = invoke(["config", "show", "run", "--brokers", "k:9092",
                             "--producer-config", "sasl.password=pw", "--config", str(config)],
                            capsys)
    assert code == ExitCode.OK, err
    rows = {line.split()[0]: line for line in out.splitlines()}
    assert "s3cret" not in out and "pw" not in rows["--producer-config"].split()[1]
    assert rows["--dsn"].endswith("env CDC_RELAY_DSN_FILE")
    assert "postgresql://relay:***@db/shop" in rows["--dsn"]
    assert rows["--slot"].endswith(f"file {config} ([run] slot)")
    assert rows["--brokers"].endswith("flag")
    assert rows["--status-interval"].split()[1:] == ["1s", "default"]
    assert rows["--message-timeout"].split()[1] == "30s"


@pytest.mark.parametrize("seconds, text", [(604800.0, "1w"), (86400.0, "1d"), (300.0, "5m"),
                                           (30.0, "30s"), (0.5, "500ms"), (90.0, "90s"),
                                           (0.0, "0")])
def test_config_show_writes_durations_with_a_unit(seconds: float, text: str) -> None:
    assert duration_text(seconds) == text
    assert parse_duration(text) == seconds


def test_a_value_may_come_from_a_file_named_by_the_variable_with_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("CDC_RELAY_DSN", raising=False)
    monkeypatch.setenv("CDC_RELAY_DSN_FILE", str(tmp_path / "missing"))
    code, _, err = invoke(["init"], capsys)
    assert code == ExitCode.USAGE and "cannot read CDC_RELAY_DSN_FILE=" in err
    (tmp_path / "dsn").write_text(CLOSED + "\n")
    monkeypatch.setenv("CDC_RELAY_DSN_FILE", str(tmp_path / "dsn"))
    code, _, err = invoke(["init"], capsys)
    assert code == ExitCode.UNAVAILABLE  # the DSN from the file was used: port 1 is closed
    assert "hunter2" not in err


@pytest.mark.parametrize("where", ["flag", "file"])
def test_json_logging_makes_usage_errors_json_too(
        where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("CDC_RELAY_LOG_FORMAT", raising=False)
    config = tmp_path / "relay.toml"
    config.write_text('[run]\nlog_format = "json"\n')
    args = (["run", "--log-format", "json", "--frobnicate"] if where == "flag"
            else ["--config", str(config), "run", "--frobnicate"])
    root = logging.getLogger()
    before = list(root.handlers)
    try:
        code, _, err = invoke(args, capsys)
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in before:
            root.addHandler(handler)
    assert code == ExitCode.USAGE
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("{") and "--frobnicate" in lines[0]


def test_the_default_plugin_is_pgoutput_and_run_takes_the_slots_when_none_is_given() -> None:
    assert ReplicationConfig(dsn="x").plugin == "pgoutput"
    assert not ReplicationConfig(dsn="x").plugin_from_slot
    param = next(p for p in cli.commands["run"].params if p.name == "plugin")
    assert param.default is None  # resolved at start-up: the slot's plugin, else pgoutput


def test_a_permission_error_gets_the_grant_for_the_role() -> None:
    fix = privilege_fix("permission denied for table outbox_events", "SELECT, UPDATE", "relay")
    assert fix == "GRANT SELECT, UPDATE ON outbox_events TO relay;"
    assert privilege_fix("permission denied for schema ops", None, "relay").startswith(
        "GRANT USAGE ON SCHEMA ops TO relay;")
    assert "polling mode; WAL mode needs SELECT" in privilege_fix(
        "permission denied for table outbox_events", None, None)
    assert "must own" not in privilege_fix("must be owner of table outbox_events", None, "r")


def _record(msg: str, level: int = logging.ERROR, **extra: object) -> logging.LogRecord:
    record = logging.LogRecord("cdc_relay.x", level, "f", 1, msg, None, None)
    for key, value in extra.items():
        setattr(record, key, value)
    return record


def test_repeated_failure_lines_pass_three_times_then_once_per_window_with_a_count() -> None:
    now = [0.0]
    repeat = RepeatFilter(window=60.0, burst=3, clock=lambda: now[0])
    passed = []
    for second in range(120):
        now[0] = float(second)
        record = _record(f"sink generation {second} failed: connection refused")
        if repeat.filter(record):
            passed.append((second, getattr(record, "repeated", 0)))
    assert passed == [(0, 0), (1, 0), (2, 0), (60, 57), (61, 0), (62, 0)]
    assert repeat.filter(_record("another failure"))  # other text passes
    for _ in range(5):
        assert repeat.filter(_record("info line 1", logging.INFO))
        # event lines are never held
        assert repeat.filter(_record("dead-lettered 1", logging.WARNING, event_id="a"))
