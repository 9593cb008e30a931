"""Choosing and configuring the RabbitMQ and NATS sinks: parsing, defaults, clear errors, extras."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from cdc_relay.cli.main import cli
from cdc_relay.cli.options import load_config_file, run_cli
from cdc_relay.cli.sink_options import sink_settings
from cdc_relay.config import KafkaConfig
from cdc_relay.errors import ConfigError
from cdc_relay.ops.metrics.collectors import SinkInfoCollector
from cdc_relay.sink.config import (
    NatsConfig,
    RabbitMqConfig,
    default_subjects,
    parse_nats,
    parse_rabbitmq,
    subject_problem,
)
from cdc_relay.sink.factory import make_sink_factory, sink_name

AMQP = "amqp://guest:guest@127.0.0.1:5672/%2F"


def test_rabbitmq_defaults_follow_the_router_dead_letter_topic() -> None:
    config = parse_rabbitmq(AMQP, [], dead_letter_topic="x.dlq", message_timeout_ms=5000)
    assert (config.exchange, config.declare_exchange, config.dlx) == ("outbox", True, "outbox")
    assert config.dead_letter_routing_key == "x.dlq" and config.dead_letter_queue == "x.dlq"
    assert config.message_timeout_ms == 5000


def test_rabbitmq_settings_override_the_defaults() -> None:
    config = parse_rabbitmq(AMQP, ["exchange=events", "dead_letter_exchange=dlx",
                                   "dead_letter_queue=", "declare_exchange=no",
                                   "max_in_flight=7"], dead_letter_topic="d")
    assert (config.exchange, config.dlx, config.dead_letter_queue) == ("events", "dlx", None)
    assert (config.declare_exchange, config.max_in_flight) == (False, 7)


@pytest.mark.parametrize(("brokers", "items", "fragment"), [
    ("localhost:5672", [], "expected amqp://"),
    (AMQP, ["exchange="], "default exchange"),
    (AMQP, ["max_in_flight=0"], "positive integer"),
    (AMQP, ["declare_exchange=maybe"], "true or false"),
    (AMQP, ["nope=1"], "unknown --sink-config key 'nope'"),
    (AMQP, ["exchange"], "KEY=VALUE"),
])
def test_bad_rabbitmq_settings_are_config_errors(brokers: str, items: list[str],
                                                 fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        parse_rabbitmq(brokers, items, dead_letter_topic="d")


def test_a_bad_amqp_url_never_shows_its_password() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_rabbitmq("http://guest:s3cret@host/", [], dead_letter_topic="d")
    assert "s3cret" not in str(caught.value)


def test_nats_defaults_derive_the_stream_subjects_from_the_pattern() -> None:
    config = parse_nats("nats://a:4222, nats://b:4222", [], topic_pattern="outbox.event.{aggregate_type}",
                        dead_letter_topic="outbox.dead-letters")
    assert config.servers == ("nats://a:4222", "nats://b:4222")
    assert config.stream_subjects == ("outbox.event.>", "outbox.dead-letters")
    assert (config.stream, config.create_stream, config.duplicate_window) == ("OUTBOX", True, 120.0)


@pytest.mark.parametrize(("pattern", "dead", "subjects"), [
    ("p.{aggregate_type}", "p.dlq", ("p.>",)),
    ("a.b.{aggregate_type}.{event_type}", "dl", ("a.b.>", "dl")),
    ("fixed.topic", "dl", ("fixed.topic", "dl")),
    ("ev.x{aggregate_type}", "dl", ("ev.>", "dl")),
])
def test_default_subjects(pattern: str, dead: str, subjects: tuple[str, ...]) -> None:
    assert default_subjects(pattern, dead) == subjects


def test_a_pattern_starting_with_a_placeholder_needs_explicit_subjects() -> None:
    with pytest.raises(ConfigError, match="stream_subjects"):
        parse_nats("nats://a:4222", [], topic_pattern="{aggregate_type}", dead_letter_topic="d")
    config = parse_nats("nats://a:4222", ["stream_subjects=orders.*, d"],
                        topic_pattern="{aggregate_type}", dead_letter_topic="d")
    assert config.stream_subjects == ("orders.*", "d")


@pytest.mark.parametrize(("brokers", "items", "fragment"), [
    ("127.0.0.1:4222", [], "expected nats://"),
    ("nats://a:4222", ["stream=a.b"], "stream name"),
    ("nats://a:4222", ["duplicate_window=soon"], "duplicate_window"),
    ("nats://a:4222", ["create_stream=2"], "true or false"),
])
def test_bad_nats_settings_are_config_errors(brokers: str, items: list[str], fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        parse_nats(brokers, items, topic_pattern="o.{aggregate_type}", dead_letter_topic="d")


@pytest.mark.parametrize(("subject", "ok"), [
    ("outbox.event.order", True), ("a", True), ("a..b", False), (".a", False), ("a.", False),
    ("a.*", False), ("a.>", False), ("a b", False), ("", False),
])
def test_subject_problem(subject: str, ok: bool) -> None:
    assert (subject_problem(subject) is None) is ok


def test_sink_options_route_each_sink_to_its_config() -> None:
    common = {"topic_pattern": "o.{aggregate_type}", "dead_letter_topic": "d", "message_timeout": 3.0}
    assert sink_settings("kafka", "h:9092", (), ("acks=all",), **common) is None
    rabbit = sink_settings("rabbitmq", AMQP, ("exchange=e",), (), **common)
    assert isinstance(rabbit, RabbitMqConfig) and rabbit.message_timeout_ms == 3000
    assert isinstance(sink_settings("nats", "nats://h:4222", (), (), **common), NatsConfig)
    assert [sink_name(x) for x in (None, rabbit)] == ["kafka", "rabbitmq"]


@pytest.mark.parametrize(("sink", "brokers", "sink_config", "producer_config", "fragment"), [
    ("kafka", "h:9092", ("exchange=e",), (), "--sink-config is for"),
    ("kafka", AMQP, (), (), "add --sink rabbitmq"),
    ("kafka", "nats://h:4222", (), (), "add --sink nats"),
    ("rabbitmq", AMQP, (), ("acks=all",), "--producer-config is for the Kafka sink"),
])
def test_mixed_up_sink_options_are_config_errors(sink: str, brokers: str, sink_config: tuple[str, ...],
                                                 producer_config: tuple[str, ...],
                                                 fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        sink_settings(sink, brokers, sink_config, producer_config, topic_pattern="o.{aggregate_type}",
                      dead_letter_topic="d", message_timeout=1.0)


def test_a_missing_client_library_names_the_pip_install(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [m for m in sys.modules if m == "pika" or m.startswith("pika.")
                 or m == "cdc_relay.sink.rabbitmq"]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "pika", None)  # import pika -> ModuleNotFoundError
    config = parse_rabbitmq(AMQP, [], dead_letter_topic="d")
    with pytest.raises(ConfigError, match=r"pip install 'cdc-relay\[rabbitmq\]'"):
        make_sink_factory(KafkaConfig("unused:1"), config)


def test_the_cli_reports_a_sink_option_error_in_one_line_with_exit_2(
        capsys: pytest.CaptureFixture[str]) -> None:
    code = run_cli(cli, ["poll", "--dsn", "host=x", "--sink", "nats", "--brokers", "nats://h:4222",
                         "--sink-config", "colour=blue"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "unknown --sink-config key 'colour'" in err[0]


def test_sink_config_comes_from_a_toml_table(tmp_path: Path) -> None:
    config = tmp_path / "relay.toml"
    config.write_text('sink = "rabbitmq"\n[run.sink_config]\nexchange = "events"\n'
                      'dead_letter_queue = "dlq"\n')
    default_map = load_config_file(str(config), cli)
    assert default_map["run"]["sink"] == "rabbitmq"
    assert default_map["run"]["sink_config"] == ("exchange=events", "dead_letter_queue=dlq")
    assert default_map["poll"]["sink"] == "rabbitmq"


def test_the_metrics_name_the_sink() -> None:
    [family] = list(SinkInfoCollector("nats").collect())
    assert family.name == "cdc_relay_sink_info"
    assert [(s.labels, s.value) for s in family.samples] == [({"sink": "nats"}, 1)]
