"""``--snapshot``: flag, CDC_RELAY_SNAPSHOT, the config file, polling mode; the backfill metrics."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdc_relay.cli.main import cli
from cdc_relay.cli.options import load_config_file, run_cli
from cdc_relay.errors import ConfigError, ExitCode
from cdc_relay.ops.metrics.collectors import BackfillCollector
from cdc_relay.wal.backfill.loop import BackfillStats

CLOSED = "host=127.0.0.1 port=1 dbname=x user=u connect_timeout=2"


def test_an_unknown_value_from_the_environment_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CDC_RELAY_SNAPSHOT", "sometimes")
    assert run_cli(cli, ["run", "--dsn", CLOSED, "--brokers", "b:1"]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert "CDC_RELAY_SNAPSHOT" in err and "initial" in err and len(err.splitlines()) == 1


def test_the_config_file_sets_it_for_run_and_never_for_poll(tmp_path: Path) -> None:
    shared = tmp_path / "relay.toml"
    shared.write_text('snapshot = "initial"\n')
    default_map = load_config_file(str(shared), cli)
    assert default_map["run"]["snapshot"] == "initial"
    assert "snapshot" not in default_map["poll"] and "poll_snapshot" not in default_map["poll"]
    wrong = tmp_path / "wrong.toml"
    wrong.write_text('[poll]\nsnapshot = "initial"\n')
    with pytest.raises(ConfigError, match="unknown key 'snapshot'"):
        load_config_file(str(wrong), cli)


def test_poll_refuses_it_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(cli, ["poll", "--dsn", CLOSED, "--brokers", "b:1", "--snapshot",
                         "initial"]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert "WAL-mode option" in err and len(err.splitlines()) == 1


def test_backfill_metrics_follow_the_stats() -> None:
    stats = BackfillStats(running=True, rows_total=10, rows_done=4, rate=2.5, snapshot_age=3.0)
    values = {m.name: m.samples[0].value for m in BackfillCollector(stats).collect()}
    assert values == {"cdc_relay_backfill_running": 1, "cdc_relay_backfill_finished": 0,
                      "cdc_relay_backfill_rows_total": 10, "cdc_relay_backfill_rows_done": 4,
                      "cdc_relay_backfill_rows_per_second": 2.5,
                      "cdc_relay_backfill_snapshot_age_seconds": 3.0}
