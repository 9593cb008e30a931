"""``run --exactly-once``'s options: one line and exit 2 for what cannot work."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdc_relay.cli.exactly_once import settings_from
from cdc_relay.cli.main import cli
from cdc_relay.cli.options import run_cli
from cdc_relay.config import ExactlyOnceConfig
from cdc_relay.errors import ConfigError, ExitCode

CLOSED = "host=127.0.0.1 port=1 dbname=x user=u password=hunter2 connect_timeout=2"
RUN = ["run", "--dsn", CLOSED, "--brokers", "127.0.0.1:1"]


def _invoke(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = run_cli(cli, args)
    return code, capsys.readouterr().err


@pytest.mark.parametrize(("extra", "needle"), [
    (["--reset-checkpoint"], "--reset-checkpoint only applies with --exactly-once"),
    (["--exactly-once", "--checkpoint-topic", "bad topic"], "invalid --checkpoint-topic"),
    (["--exactly-once", "--transaction-timeout", "20m"], "--transaction-timeout"),
    (["--exactly-once", "--txn-interval", "0s"], "--txn-interval must be positive"),
    (["--exactly-once", "--producer-config", "transactional.id=x"], "transactional.id"),
    (["--exactly-once", "--message-timeout", "90s"], "must not exceed --transaction-timeout"),
    (["--exactly-once", "--txn-split-events", "0"], "--txn-split-events"),
    (["--exactly-once", "--sink", "nats", "--brokers", "nats://127.0.0.1:1"], "--sink kafka only"),
    (["--exactly-once", "--snapshot", "initial"], "--snapshot initial cannot be combined"),
    (["--exactly-once", "--snapshot", "initial", "--capture", "public.t", "--capture-prefix", "p",
      "--plugin", "pgoutput", "--no-outbox"], "--snapshot initial cannot be combined"),
])
def test_bad_exactly_once_options_exit_2_with_one_line(
        extra: list[str], needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _invoke([*RUN, *extra], capsys)
    assert code == ExitCode.USAGE, err
    assert needle in err
    assert "Traceback" not in err and "hunter2" not in err


def test_options_come_from_env_and_config_file_too(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("CDC_RELAY_RESET_CHECKPOINT", "1")
    code, err = _invoke(RUN, capsys)
    assert code == ExitCode.USAGE and "--reset-checkpoint only applies" in err
    config = tmp_path / "relay.toml"
    config.write_text('[run]\nexactly-once = true\ncheckpoint-topic = "bad topic"\n')
    monkeypatch.delenv("CDC_RELAY_RESET_CHECKPOINT")
    code, err = _invoke(["--config", str(config), *RUN], capsys)
    assert code == ExitCode.USAGE and "invalid --checkpoint-topic" in err


def test_settings_from_the_options() -> None:
    values = {"exactly_once": True, "checkpoint_topic": "cp", "txn_interval": 0.02,
              "txn_max_events": 5, "txn_max_bytes": 100, "txn_split_events": None,
              "transaction_timeout": 120.0, "reset_checkpoint": False}
    assert settings_from(values) == ExactlyOnceConfig(
        checkpoint_topic="cp", txn_interval=0.02, txn_max_events=5, txn_max_bytes=100,
        transaction_timeout_ms=120_000)
    assert settings_from({**values, "exactly_once": False}) is None
    with pytest.raises(ConfigError):
        settings_from({**values, "exactly_once": False, "reset_checkpoint": True})
