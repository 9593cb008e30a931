"""The options of ``run --exactly-once``, gathered into one ExactlyOnceConfig value.

``exactly_once_options`` adds the flags to a command and hands the command a single
``exactly_once`` argument (None unless ``--exactly-once``), so the command itself stays
one line longer. Every option has its ``CDC_RELAY_*`` variable and config-file key like
the others. It must not contain command logic.
"""

from __future__ import annotations

import functools
from typing import Any

import click

from cdc_relay.cli.options import DURATION, F, option
from cdc_relay.config import ExactlyOnceConfig
from cdc_relay.errors import ConfigError

_NAMES = ("exactly_once", "checkpoint_topic", "txn_interval", "txn_max_events",
          "txn_max_bytes", "txn_split_events", "transaction_timeout", "reset_checkpoint")


def exactly_once_options(f: F) -> F:
    """Add the exactly-once options; the command receives ``exactly_once=ExactlyOnceConfig|None``."""

    @functools.wraps(f)
    def command(*args: Any, **kwargs: Any) -> Any:
        values = {name: kwargs.pop(name) for name in _NAMES}
        kwargs["exactly_once"] = settings_from(values)
        return f(*args, **kwargs)

    decorators = [
        option("--exactly-once", is_flag=True, default=False,
               help="Kafka transactions: a read_committed consumer sees every event once, all "
                    "of a PostgreSQL transaction or none (docs/exactly-once.md)."),
        option("--checkpoint-topic", default="cdc-relay.checkpoints", show_default=True,
               help="Compacted one-partition topic for the checkpoint (created if missing)."),
        option("--txn-interval", type=DURATION, default="100ms", show_default=True,
               help="Commit the Kafka transaction at the first commit boundary after this long."),
        option("--txn-max-events", type=click.IntRange(1), default=10_000, show_default=True,
               help="... or once it holds this many events."),
        option("--txn-max-bytes", type=click.IntRange(1), default=16 * 1024 * 1024,
               show_default=True, help="... or this many payload bytes."),
        option("--txn-split-events", type=click.IntRange(1), default=None,
               help="Split a PostgreSQL transaction after this many events per Kafka "
                    "transaction (default: never split; see docs/exactly-once.md)."),
        option("--transaction-timeout", type=DURATION, default="60s", show_default=True,
               help="transaction.timeout.ms: must cover the largest PostgreSQL transaction."),
        option("--reset-checkpoint", is_flag=True, default=False,
               help="Ignore the checkpoint topic's record for this slot (another cluster's, "
                    "or unwanted) and start from the slot."),
    ]
    wrapped: Any = command
    for decorator in reversed(decorators):
        wrapped = decorator(wrapped)
    return wrapped  # type: ignore[no-any-return]


def settings_from(values: dict[str, Any]) -> ExactlyOnceConfig | None:
    """The settings, or None without ``--exactly-once`` (then the other options must be unset)."""
    if not values["exactly_once"]:
        if values["reset_checkpoint"]:
            raise ConfigError("--reset-checkpoint only applies with --exactly-once")
        return None
    return ExactlyOnceConfig(
        checkpoint_topic=values["checkpoint_topic"], txn_interval=values["txn_interval"],
        txn_max_events=values["txn_max_events"], txn_max_bytes=values["txn_max_bytes"],
        txn_split_events=values["txn_split_events"],
        transaction_timeout_ms=int(values["transaction_timeout"] * 1000),
        reset_checkpoint=values["reset_checkpoint"])
