"""Doctor on what each mode installs: the trigger in WAL mode, unread slots, partitions."""

from __future__ import annotations

from dataclasses import replace

from cdc_relay.ops.doctor.checks import table_checks
from cdc_relay.ops.doctor.facts import DoctorSettings, PublicationFacts
from cdc_relay.ops.doctor.slot_checks import idle_slot_checks, slot_checks
from cdc_relay.ops.verdicts import Verdict
from tests.unit.test_doctor_checks import SLOT, TABLE, by_name, facts

WAL = DoctorSettings(dsn="host=db dbname=app", plugin="wal2json")
PGOUTPUT = DoctorSettings(dsn="host=db dbname=app", plugin="pgoutput")
POLL = DoctorSettings(dsn="host=db dbname=app", mode="poll")
GIB = 2**30


def test_a_notify_trigger_in_wal_mode_is_reported_as_a_cost() -> None:
    check = by_name(table_checks(facts(), WAL))["notify trigger"]
    assert check.verdict is Verdict.WARN
    assert "PREPARE TRANSACTION" in check.detail and "every insert" in check.detail
    assert check.fix is not None and "cdc-relay init" in check.fix


def test_the_trigger_passes_in_polling_mode_and_its_absence_passes_in_wal_mode() -> None:
    assert by_name(table_checks(facts(), POLL))["notify trigger"].verdict is Verdict.PASS
    no_trigger = facts(table=replace(TABLE, trigger=False))
    assert by_name(table_checks(no_trigger, WAL))["notify trigger"].verdict is Verdict.PASS


def test_an_inactive_slot_retaining_wal_fails_in_wal_mode_with_its_size() -> None:
    idle = replace(SLOT, active=False, active_pid=None, retained_bytes=3 * GIB)
    check = by_name(slot_checks(facts(slot=idle), WAL))["slot"]
    assert check.verdict is Verdict.FAIL
    assert "3.0 GiB" in check.detail
    assert check.fix is not None and "cdc-relay run" in check.fix and "slot drop" in check.fix


def test_a_freshly_created_inactive_slot_passes_in_wal_mode() -> None:
    fresh = replace(SLOT, active=False, active_pid=None, retained_bytes=56)
    assert by_name(slot_checks(facts(slot=fresh), WAL))["slot"].verdict is Verdict.PASS


def test_polling_mode_fails_for_every_inactive_slot_of_the_database() -> None:
    idle = (replace(SLOT, active=False, retained_bytes=5 * 2**20),
            replace(SLOT, name="old_slot", active=False, retained_bytes=GIB))
    checks = idle_slot_checks(replace(facts(), idle_slots=idle))
    assert [c.verdict for c in checks] == [Verdict.FAIL, Verdict.FAIL]
    assert "5.0 MiB" in checks[0].detail and "1.0 GiB" in checks[1].detail
    assert checks[1].fix is not None and "--slot old_slot" in checks[1].fix
    assert [c.verdict for c in idle_slot_checks(facts())] == [Verdict.PASS]


def test_a_partitioned_outbox_needs_its_publication_to_publish_via_the_root() -> None:
    table = replace(TABLE, partitions=3, owner=False)
    publication = PublicationFacts(True, inserts=True, includes_table=True, via_root=False)
    check = by_name(table_checks(facts(table=table, publication=publication), PGOUTPUT))["publication"]
    assert check.verdict is Verdict.FAIL
    assert check.fix == 'ALTER PUBLICATION "cdc_relay_outbox" SET (publish_via_partition_root = true);'
    fixed = replace(publication, via_root=True)
    check = by_name(table_checks(facts(table=table, publication=fixed), PGOUTPUT))["publication"]
    assert check.verdict is Verdict.PASS and "partition root" in check.detail


def test_the_table_check_says_the_outbox_is_partitioned() -> None:
    table = replace(TABLE, partitions=12)
    check = by_name(table_checks(facts(table=table), WAL))["outbox table"]
    assert check.verdict is Verdict.PASS and "partitioned, 12 partition(s)" in check.detail
