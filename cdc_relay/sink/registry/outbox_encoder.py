"""The outbox's Encoder with the options that go beyond a JSON payload and a string key.

Owns ``OutboxEncoder``: confluent-kafka's serializers as ``Encoder`` builds them
(cdc_relay/sink/registry/encoder.py), plus a struct key (``--key-schema``:
cdc_relay/sink/registry/struct_key.py) and pre-encoded payloads passed through
(``--value-encoding pre-encoded``: cdc_relay/sink/registry/pre_encoded.py). The sink
factory builds this one; without those options it encodes exactly as ``Encoder``.

Must not: produce, or decide what happens to a failed event.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from confluent_kafka.schema_registry import SchemaRegistryClient

from cdc_relay.config import RegistryConfig
from cdc_relay.model import Message
from cdc_relay.sink.registry.encoder import Encoder, _serializer_conf
from cdc_relay.sink.registry.pre_encoded import PreEncoded
from cdc_relay.sink.registry.struct_key import struct_key


class OutboxEncoder(Encoder):
    """Encoder with a struct key and pre-encoded payloads, when configured."""

    def __init__(self, config: RegistryConfig, client: SchemaRegistryClient | None = None) -> None:
        super().__init__(config, client)
        if config.key_schema:
            self._key, self._key_convert = struct_key(config, self.client, _serializer_conf(config))
        self._pre_encoded = (PreEncoded(config, self.client)
                             if config.value_encoding == "pre-encoded" else None)

    def _value(self, message: Message, event_type: str) -> Callable[[], bytes | None]:
        if self._pre_encoded is None:
            return super()._value(message, event_type)
        return functools.partial(self._pre_encoded.value, message.value or b"")
