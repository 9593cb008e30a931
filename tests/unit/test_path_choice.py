"""The one switch between the compiled paths and pure Python (docs/design.md, "The compiled
paths"): ``--pure-python`` or CDC_RELAY_PURE_PYTHON, for ``run`` and ``poll`` alike, reaching
every compiled path; the C router's allow-list; a model whose fields the C code does not
know takes the pure path with a warning.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from cdc_relay import accel
from cdc_relay.app import poll as poll_app
from cdc_relay.app import run as app
from cdc_relay.cli.main import cli
from cdc_relay.cli.options import run_cli
from cdc_relay.config import KafkaConfig, OutboxConfig, RouterConfig
from cdc_relay.errors import ConfigError, ExitCode
from cdc_relay.model import Message, OutboxEvent
from cdc_relay.routing import Router, compiled_router_applies
from cdc_relay.sink.kafka.sink import KafkaSink, Reports

RUN = ["run", "--dsn", "host=127.0.0.1 port=1 dbname=x", "--brokers", "127.0.0.1:1"]
POLL = ["poll", "--dsn", "host=127.0.0.1 port=1 dbname=x", "--brokers", "127.0.0.1:1"]


@pytest.fixture(autouse=True)
def fresh_choice(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test makes the process's choice anew, and leaves the previous one behind."""
    monkeypatch.delenv(accel.ENV_VAR, raising=False)
    with accel.forced(False):
        yield


def chosen(args: list[str], monkeypatch: pytest.MonkeyPatch) -> frozenset[str]:
    """The extensions the command turns off, once it parsed its options (it runs nothing)."""
    monkeypatch.setattr(app, "run_wal", lambda settings: ExitCode.OK)
    monkeypatch.setattr(poll_app, "run_poll", lambda settings: ExitCode.OK)
    assert run_cli(cli, args) == ExitCode.OK
    return accel.pure_extensions()


@pytest.mark.parametrize("command", [RUN, POLL], ids=["run", "poll"])
def test_the_flag_and_the_environment_choose_for_run_and_poll(
        command: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    assert chosen(command, monkeypatch) == frozenset()
    assert chosen([*command, "--pure-python"], monkeypatch) == accel.ALL
    monkeypatch.setenv(accel.ENV_VAR, "1")
    assert chosen(command, monkeypatch) == accel.ALL
    monkeypatch.setenv(accel.ENV_VAR, "_croute, _creports")
    assert chosen(command, monkeypatch) == {"_croute", "_creports"}


def test_the_old_flag_still_works_and_says_it_is_deprecated(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    assert chosen([*RUN, "--pure-python-decoder"], monkeypatch) == accel.ALL
    assert "--pure-python-decoder is deprecated: use --pure-python" in capsys.readouterr().err


def test_an_unknown_extension_in_the_environment_is_one_line_and_a_usage_exit(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(accel.ENV_VAR, "_cfast")
    monkeypatch.setattr(app, "run_wal", lambda settings: ExitCode.OK)
    assert run_cli(cli, RUN) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert "unknown extension _cfast" in err and "Traceback" not in err
    with pytest.raises(ConfigError):
        accel.parse("yes")


@pytest.mark.skipif(not accel.all_built(), reason="compiled extensions not built")
@pytest.mark.parametrize("pure", [False, True])
def test_the_choice_reaches_every_compiled_path(pure: bool) -> None:
    with accel.forced(pure):
        for plugin in ("wal2json", "pgoutput"):
            repl = SimpleNamespace(plugin=plugin, publication="p", dsn="host=x")
            decoder, _ = app.make_decoder(repl, OutboxConfig())  # type: ignore[arg-type]
            assert getattr(decoder, "compiled") is not pure  # noqa: B009  # not in the Protocol
        assert Router(RouterConfig()).compiled is not pure
        sink = KafkaSink(KafkaConfig("127.0.0.1:1"), lambda token, error: None)
        assert (type(sink._reports) is Reports) is pure
        assert (sink._sender is None) is pure
        sink._producer = None  # nothing was produced: no flush
        assert (accel.extension("_cstream") is None) is pure  # ReplicationStream.changes asks


def test_the_c_router_applies_only_to_configurations_it_knows() -> None:
    assert compiled_router_applies(RouterConfig(topic_pattern="t.{event_type}",
                                                dead_letter_topic="dead"))
    for changed in (RouterConfig(message_format="debezium-json"),
                    RouterConfig(header_columns=(("tenant", "tenant"),)),
                    RouterConfig(partition_column="shard")):
        assert not compiled_router_applies(changed)
        assert not Router(changed).compiled

    @dataclasses.dataclass(frozen=True)
    class WithAnOption(RouterConfig):  # a field the C router was never told about
        cloudevents_source: str = "/orders"

    assert not compiled_router_applies(WithAnOption())
    assert not Router(WithAnOption()).compiled


def test_the_c_router_knows_every_router_config_field() -> None:
    """A new RouterConfig field turns the compiled router off until routing.py's
    allow-list says what it may be (_C_ROUTER_ANY / _C_ROUTER_ONLY)."""
    from cdc_relay import routing

    known = routing._C_ROUTER_ANY | set(routing._C_ROUTER_ONLY)
    assert {field.name for field in dataclasses.fields(RouterConfig)} <= known


@dataclasses.dataclass(slots=True)
class WiderEvent:
    id: str
    aggregate_type: str
    aggregate_id: str
    event_type: str
    payload: bytes
    created_at_ms: int | None
    lsn: int
    attempt: int = 1
    extra: tuple[str | None, ...] = ()
    traceparent: str | None = None
    tracestate: str | None = None
    tenant: str | None = None  # the field a developer just added


@pytest.mark.skipif(not accel.all_built(), reason="compiled extensions not built")
def test_a_model_field_the_c_code_does_not_know_takes_the_pure_path_with_a_warning(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    module = accel.extension("_cwal2json")
    assert module is not None and accel.fields_problem(module) is None
    problem = accel.fields_problem(module, outbox=WiderEvent)
    assert problem is not None and "edit the C slot list (cdc_relay/decoding/_cslots.h)" in problem
    caplog.set_level(logging.WARNING, logger="cdc_relay")
    monkeypatch.setattr(accel, "OutboxEvent", WiderEvent)
    monkeypatch.setattr(accel, "_warned", set())
    assert accel.extension("_cwal2json") is None
    assert accel.extension("_croute") is None  # reads OutboxEvent too
    assert accel.extension("_creports") is not None  # Message only
    assert any("_cwal2json: running its pure-Python twin instead" in r.getMessage()
               and "edit the C slot list" in r.getMessage() for r in caplog.records)


def test_every_extension_mirrors_today_s_model() -> None:
    for name in accel.built():
        module = __import__(accel.EXTENSIONS[name], fromlist=["_"])
        assert accel.fields_problem(module, OutboxEvent, Message) is None, name
