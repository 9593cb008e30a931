"""The relay against a protected schema registry: a real nginx (TLS with a CA of its own,
basic auth, a bearer token) in front of Apicurio. The right credentials work, wrong ones
stop the relay with one line naming the registry and the fix, exit 6, the password never
shown (docs/messages.md, schema registry: access)."""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext

from cdc_relay.errors import ExitCode
from cdc_relay.local.apache_kafka import ApacheKafka
from cdc_relay.local.apicurio import ApicurioRegistry
from cdc_relay.local.nginx import RegistryProxy
from tests.integration.test_registry_outbox import relay_command
from tests.integration.test_schema_registry import GOOD, emit_events, schema_file
from tests.integration.wal_support import init_db, start_relay
from tests.support import KafkaCollector, Msg, init_outbox, wait_for

pytestmark = pytest.mark.integration


def credentials(proxy: RegistryProxy, kind: str, secret: str | None = None) -> tuple[str, ...]:
    """--schema-registry and its settings for ``kind`` (basic, bearer), with ``secret``
    instead of the right one when given."""
    if kind == "basic":
        url = proxy.basic_url
        auth = [f"basic.auth.user.info={proxy.user}:{secret or proxy.password}"]
    else:
        url = proxy.bearer_url
        auth = ["bearer.auth.credentials.source=STATIC_TOKEN",
                f"bearer.auth.token={secret or proxy.token}", "bearer.auth.logical.cluster=lsrc-1"]
    settings = [f"ssl.ca.location={proxy.ca}", *auth]
    return ("--schema-registry", url, *(a for s in settings for a in ("--schema-registry-config", s)))


def assert_delivered(registry: ApicurioRegistry, message: Msg, event: str) -> None:
    """``message`` is ``event``, its value GOOD as confluent-kafka's deserializer reads it."""
    assert message.headers["id"].decode() == event
    reader = AvroDeserializer(SchemaRegistryClient({"url": registry.ccompat_url}))
    assert reader(message.value, SerializationContext(message.topic, MessageField.VALUE)) == GOOD


@pytest.mark.parametrize("kind", ["basic", "bearer"])
def test_the_right_credentials_over_tls_with_a_custom_ca_deliver(
        db: str, broker: ApacheKafka, schema_registry: ApicurioRegistry,
        registry_proxy: RegistryProxy, topic_prefix: str, tmp_path: Path, kind: str) -> None:
    init_db(db, plugin="pgoutput")
    (event,) = emit_events(db, ("o-1", "OrderCreated", GOOD))
    args = ("--message-format", "avro", "--value-schema",
            f"OrderCreated={schema_file(tmp_path, 'avro')}", *credentials(registry_proxy, kind))
    with start_relay(db, broker.bootstrap, topic_prefix, plugin="pgoutput", extra=args) as relay, \
            KafkaCollector(broker.bootstrap, topic_prefix) as collector:
        (message,) = collector.collect(count=1, timeout=60)
        assert relay.stop() == 0, relay.stderr
    assert_delivered(schema_registry, message, event)


@pytest.mark.parametrize(("mode", "kind"), [("run", "basic"), ("run", "bearer"), ("poll", "basic")])
def test_wrong_credentials_stop_the_relay_with_one_line_and_exit_6_before_any_event(
        db: str, broker: ApacheKafka, registry_proxy: RegistryProxy, topic_prefix: str,
        tmp_path: Path, mode: str, kind: str) -> None:
    if mode == "run":
        init_db(db, plugin="pgoutput")
    else:
        init_outbox(db, "--no-slot")
    (event,) = emit_events(db, ("o-1", "OrderCreated", GOOD))
    wrong = "not-the-Pa55word"
    args = ("--message-format", "avro", "--value-schema",
            f"OrderCreated={schema_file(tmp_path, 'avro')}", *credentials(registry_proxy, kind, wrong))
    with relay_command(mode, db, broker.bootstrap, topic_prefix, args, wait=False) as relay, \
            KafkaCollector(broker.bootstrap, topic_prefix) as collector:
        wait_for(lambda: not relay.running(), timeout=60, message="the relay exiting")
        assert collector.collect(timeout=1.0) == []  # nothing sent, the event waits in the slot
    assert relay.stop() == ExitCode.REFUSED, relay.stderr
    url = registry_proxy.basic_url if kind == "basic" else registry_proxy.bearer_url
    lines = [line for line in relay.stderr.splitlines() if "refused the relay's credentials" in line]
    assert lines and url in lines[0] and "Fix: check basic.auth.user.info" in lines[0], relay.stderr
    assert wrong not in relay.stderr
    assert "Traceback" not in relay.stderr
    del event  # still in the outbox: the next relay with the right password sends it


def test_a_registry_whose_certificate_is_not_trusted_holds_the_event_back_with_one_line(
        db: str, broker: ApacheKafka, registry_proxy: RegistryProxy, topic_prefix: str,
        tmp_path: Path) -> None:
    init_db(db, plugin="pgoutput")
    emit_events(db, ("o-1", "OrderCreated", GOOD))
    args = ("--message-format", "avro", "--value-schema",
            f"OrderCreated={schema_file(tmp_path, 'avro')}", "--schema-registry",
            registry_proxy.basic_url, "--schema-registry-config",
            f"basic.auth.user.info={registry_proxy.user}:{registry_proxy.password}")
    with start_relay(db, broker.bootstrap, topic_prefix, plugin="pgoutput", extra=args) as relay, \
            KafkaCollector(broker.bootstrap, topic_prefix) as collector:
        wait_for(lambda: "CERTIFICATE_VERIFY_FAILED" in relay.stderr, timeout=60,
                 message="the certificate line")
        assert collector.collect(timeout=1.0) == []
        assert relay.stop() == 0, relay.stderr
    assert registry_proxy.password not in relay.stderr


def test_a_subject_the_user_may_not_write_waits_with_one_line_until_it_is_granted(
        db: str, broker: ApacheKafka, schema_registry: ApicurioRegistry,
        registry_proxy: RegistryProxy, topic_prefix: str, tmp_path: Path) -> None:
    init_db(db, plugin="pgoutput")
    (event,) = emit_events(db, ("o-1", "OrderCreated", GOOD))
    registry_proxy.forbid_registration(True)
    args = ("--message-format", "avro", "--value-schema",
            f"OrderCreated={schema_file(tmp_path, 'avro')}", *credentials(registry_proxy, "basic"))
    with start_relay(db, broker.bootstrap, topic_prefix, plugin="pgoutput", extra=args) as relay, \
            KafkaCollector(broker.bootstrap, topic_prefix) as collector:
        wait_for(lambda: "does not let this user use the subject (HTTP 403" in relay.stderr,
                 timeout=60, message="the 403 line")
        assert collector.collect(timeout=1.0) == []  # waits: nothing sent, nothing skipped
        assert relay.running()
        registry_proxy.forbid_registration(False)  # the admin grants it
        (message,) = collector.collect(count=1, timeout=90)
        assert relay.stop() == 0, relay.stderr
    assert_delivered(schema_registry, message, event)
    assert registry_proxy.password not in relay.stderr
