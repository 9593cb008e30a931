"""Which decoding path ``cdc-relay run`` takes: compiled where built, pure Python on request."""

from __future__ import annotations

import logging

import pytest

from cdc_relay.cli.main import cli
from cdc_relay.cli.options import run_cli
from cdc_relay.config import OutboxConfig, ReplicationConfig
from cdc_relay.errors import ExitCode
from cdc_relay.wal import app
from cdc_relay.wal.app import WalSettings, make_decoder

RUN = ["run", "--dsn", "host=127.0.0.1 port=1 dbname=x", "--brokers", "127.0.0.1:1"]


def _settings(args: list[str], monkeypatch: pytest.MonkeyPatch) -> WalSettings:
    seen: list[WalSettings] = []

    def fake_run_wal(settings: WalSettings) -> int:
        seen.append(settings)
        return ExitCode.OK

    monkeypatch.setattr(app, "run_wal", fake_run_wal)
    assert run_cli(cli, args) == ExitCode.OK
    return seen[0]


def test_run_uses_the_compiled_decoder_unless_told_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _settings(RUN, monkeypatch).replication.compiled_decoder is True
    assert _settings([*RUN, "--pure-python-decoder"], monkeypatch).replication.compiled_decoder is False
    monkeypatch.setenv("CDC_RELAY_PURE_PYTHON_DECODER", "1")
    assert _settings(RUN, monkeypatch).replication.compiled_decoder is False


@pytest.mark.parametrize("plugin", ["wal2json", "pgoutput"])
def test_the_decoder_follows_the_setting(plugin: str) -> None:
    for compiled in (True, False):
        repl = ReplicationConfig(dsn="host=x", plugin=plugin, compiled_decoder=compiled)
        decoder, _ = make_decoder(repl, OutboxConfig())
        assert getattr(decoder, "compiled") is compiled  # noqa: B009  # not in the Protocol


class _Pure:
    compiled = False


def test_a_missing_compiled_decoder_is_a_warning_and_a_chosen_pure_one_is_not(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="cdc_relay")
    app._log_decoder(ReplicationConfig(dsn="host=x"), _Pure())  # type: ignore[arg-type]
    app._log_decoder(ReplicationConfig(dsn="host=x", compiled_decoder=False), _Pure())  # type: ignore[arg-type]
    levels = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert levels[0][0] == logging.WARNING and "compiled decoders are not built" in levels[0][1]
    assert levels[1] == (logging.INFO, "decoding pgoutput in pure Python (--pure-python-decoder)")


@pytest.mark.parametrize("compiled", [True, False])
def test_the_replication_reader_follows_the_setting(compiled: bool,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    args = RUN if compiled else [*RUN, "--pure-python-decoder"]
    settings = _settings(args, monkeypatch)
    relay = app.build_wal_relay(settings, sink_factory=lambda: None)  # type: ignore[arg-type,return-value]
    stream = relay._source_factory()  # built, not opened: no I/O
    assert stream._compiled is (None if compiled else False)  # type: ignore[attr-defined]
