"""The continuity options of ``run`` (docs/design.md, continuity), gathered into one value.

``continuity_options`` adds the flags to a command and hands it a single ``continuity``
argument: the ReplicationConfig fields they set. Every option has its ``CDC_RELAY_*``
variable and config-file key like the others. It must not contain command logic.
"""

from __future__ import annotations

import functools
from typing import Any

import click

from cdc_relay.cli.options import DURATION, F, option

_NAMES = ("on_slot_loss", "failover_slot", "replication_timeout")


def continuity_options(f: F) -> F:
    """Add the continuity options; the command receives ``continuity=dict`` of their values."""

    @functools.wraps(f)
    def command(*args: Any, **kwargs: Any) -> Any:
        kwargs["continuity"] = {name: kwargs.pop(name) for name in _NAMES}
        return f(*args, **kwargs)

    decorators = [
        option("--on-slot-loss", type=click.Choice(["exit", "recover"]), default="exit",
               show_default=True,
               help="When the slot this relay created is missing (a failover to a standby "
                    "without it) or invalidated: exit (code 7, naming the recovery command) or "
                    "recover by itself - a new slot, and every retained outbox row that may be "
                    "unrelayed republished at least once (docs/high-availability.md)."),
        option("--failover-slot/--no-failover-slot", default=True, show_default=True,
               help="Create the slot as a failover slot on PostgreSQL 17+, so that a standby "
                    "with sync_replication_slots holds a copy that survives a promotion."),
        option("--replication-timeout", type=DURATION, default="30s", show_default=True,
               help="Silence on the replication connection (no data, no keepalive) after which "
                    "it is taken for half-open and reconnected; a keepalive is requested "
                    "after a third of it."),
    ]
    wrapped: Any = command
    for decorator in reversed(decorators):
        wrapped = decorator(wrapped)
    return wrapped  # type: ignore[no-any-return]
