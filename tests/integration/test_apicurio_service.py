"""The real Apicurio Registry (cdc_relay.local.apicurio): started from the cached
distribution, it speaks the Confluent-compatible API that confluent-kafka's client uses,
and a restart (in-memory storage) forgets what was registered."""

from __future__ import annotations

import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

from cdc_relay.local.apicurio import ApicurioRegistry, answers_ccompat, cache_root, runner_jar

pytestmark = pytest.mark.integration

_SCHEMA = Schema('{"type":"record","name":"Smoke","fields":[{"name":"n","type":"int"}]}', "AVRO")


def test_the_registry_answers_confluent_kafkas_client(schema_registry: ApicurioRegistry) -> None:
    client = SchemaRegistryClient({"url": schema_registry.ccompat_url})
    schema_id = client.register_schema("smoke-value", _SCHEMA)
    assert client.get_schema(schema_id).schema_str.replace(" ", "") == _SCHEMA.schema_str
    assert "smoke-value" in client.get_subjects()
    assert runner_jar(cache_root() / schema_registry.version / "app") is not None


def test_a_restart_forgets_every_schema(private_schema_registry: ApicurioRegistry) -> None:
    registry = private_schema_registry
    SchemaRegistryClient({"url": registry.ccompat_url}).register_schema("gone-value", _SCHEMA)
    registry.restart()
    assert answers_ccompat(registry.url)
    assert SchemaRegistryClient({"url": registry.ccompat_url}).get_subjects() == []


def test_a_stopped_registry_does_not_answer(private_schema_registry: ApicurioRegistry) -> None:
    url = private_schema_registry.url
    private_schema_registry.stop()
    assert not answers_ccompat(url)
