"""``--capture`` patterns (capture/selection.py): a ``schema.*`` pattern never takes the
relay's own tables, and naming the relayed outbox table is refused."""

from __future__ import annotations

import pytest

from cdc_relay.capture.selection import Selection
from cdc_relay.errors import ConfigError

OUTBOX = ("public", "outbox_events")


def test_a_schema_pattern_skips_the_outbox_and_the_relays_bookkeeping_tables() -> None:
    selection = Selection.parse("public.*", own=[OUTBOX])
    assert selection.matches("public", "customers")
    assert not selection.matches(*OUTBOX)
    for table in ("cdc_relay_slots", "cdc_relay_signal", "cdc_relay_incremental",
                  "cdc_relay_backfill", "cdc_relay_schema_migrations"):
        assert not selection.matches("public", table)
    assert not selection.matches("sales", "customers")


def test_a_bookkeeping_table_named_on_its_own_is_captured() -> None:
    assert Selection.parse("public.cdc_relay_slots").matches("public", "cdc_relay_slots")


def test_naming_the_relayed_outbox_table_is_refused_in_one_line() -> None:
    with pytest.raises(ConfigError, match="outbox table the relay relays as events"):
        Selection.parse("public.customers,public.outbox_events", own=[OUTBOX])
    # without an outbox relayed (--no-outbox) it is a table like any other
    assert Selection.parse("public.outbox_events").matches(*OUTBOX)
