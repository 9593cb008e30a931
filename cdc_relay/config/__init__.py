"""Frozen, validated configuration: one dataclass per group of the user's options.

Values are validated here, at the edge, and every problem is a ConfigError naming the
option and the fix. Components receive their config object and never read the
environment or files themselves (the CLI layers flags > env > TOML file into these).

The naming rule (docs/design.md, configuration): ``*Config`` is such a group, as the user
gave it (here, or beside the sink that reads it: sink/config.py, sink/sqs/config.py);
``*Settings`` is what one command's root or one component takes, derived from Configs
(``WalSettings``, ``PollerSettings``); ``*Timings`` a loop's intervals; ``*Parts`` the
built objects a composition root hands over together.

The rooms: ``names`` (identifiers, tables, columns, durations) < ``messages`` (router,
schema registry, Kafka) and ``modes`` (replication, polling, metrics, credentials,
exactly-once, table CDC). This module only re-exports them, so ``from cdc_relay.config
import X`` is the one import path; it must define nothing of its own.
"""

from __future__ import annotations

from cdc_relay.config.messages import (
    MESSAGE_FORMATS,
    REGISTRY_FORMATS,
    RESERVED_HEADERS,
    SERIALIZER_KEYS,
    SUBJECT_STRATEGIES,
    VALUE_ENCODINGS,
    KafkaConfig,
    RegistryConfig,
    RouterConfig,
    parse_header_option,
    parse_producer_config,
    split_registry_config,
)
from cdc_relay.config.modes import (
    UNAVAILABLE_VALUE,
    CaptureConfig,
    CredentialsConfig,
    ExactlyOnceConfig,
    FlowConfig,
    MetricsConfig,
    PollConfig,
    ReplicationConfig,
    TxnLimits,
)
from cdc_relay.config.names import (
    OutboxConfig,
    TableRef,
    parse_columns,
    parse_duration,
    validate_identifier,
    validate_slot_name,
    validated_columns,
    validated_table,
)
from cdc_relay.model import OutboxColumns

__all__ = [
    "MESSAGE_FORMATS",
    "REGISTRY_FORMATS",
    "RESERVED_HEADERS",
    "SERIALIZER_KEYS",
    "SUBJECT_STRATEGIES",
    "UNAVAILABLE_VALUE",
    "VALUE_ENCODINGS",
    "CaptureConfig",
    "CredentialsConfig",
    "ExactlyOnceConfig",
    "FlowConfig",
    "KafkaConfig",
    "MetricsConfig",
    "OutboxColumns",
    "OutboxConfig",
    "PollConfig",
    "RegistryConfig",
    "ReplicationConfig",
    "RouterConfig",
    "TableRef",
    "TxnLimits",
    "parse_columns",
    "parse_duration",
    "parse_header_option",
    "parse_producer_config",
    "split_registry_config",
    "validate_identifier",
    "validate_slot_name",
    "validated_columns",
    "validated_table",
]
