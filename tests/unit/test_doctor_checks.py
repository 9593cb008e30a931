"""Doctor's checks as pure functions of gathered facts: verdicts and the fixes they print."""

from __future__ import annotations

from dataclasses import replace

import orjson

from cdc_relay.model import Lsn, SlotStatus
from cdc_relay.ops.doctor.checks import server_checks, table_checks
from cdc_relay.ops.doctor.facts import DoctorSettings, Facts, PublicationFacts, ServerFacts, TableFacts
from cdc_relay.ops.doctor.report import failed, format_checks, format_checks_json
from cdc_relay.ops.doctor.slot_checks import slot_checks
from cdc_relay.ops.verdicts import Check, Verdict

SERVER = ServerFacts(version="15.20", database="app", role="relay", superuser=False,
                     replication=True, wal_level="logical", max_slots=10, max_senders=10,
                     keep_size=10 * 2**30, slots_used=1, senders_used=1,
                     plugin_libraries="pgoutput, test_decoding, wal2json")
SLOT = SlotStatus(name="cdc_relay", plugin="wal2json", slot_type="logical", database="app",
                  active=True, active_pid=7, confirmed_flush_lsn=Lsn(1000), restart_lsn=Lsn(900),
                  lag_bytes=100, lag_seconds=0.0, retained_bytes=2**20, wal_status="reserved",
                  safe_wal_size=2**33)
TABLE = TableFacts(True, owner=False,
                   privileges={"SELECT": True, "INSERT": False, "UPDATE": True, "DELETE": False},
                   trigger=True,
                   columns=frozenset({"id", "aggregate_type", "aggregate_id", "event_type", "payload",
                                      "created_at", "attempts", "processed_at", "retry_after",
                                      "last_error", "dead_lettered_at"}))
OPTIONS = DoctorSettings(dsn="host=db dbname=app", plugin="wal2json")
NO_PUBLICATION = PublicationFacts(False)


def facts(server: ServerFacts = SERVER, table: TableFacts = TABLE,
          publication: PublicationFacts = NO_PUBLICATION,
          slot: SlotStatus | None = SLOT) -> Facts:
    return Facts(server, table, publication, slot)


def by_name(checks: list[Check]) -> dict[str, Check]:
    return {check.name: check for check in checks}


def test_a_healthy_setup_passes_every_check() -> None:
    f = facts(table=replace(TABLE, trigger=False))  # WAL mode: no NOTIFY trigger
    checks = server_checks(f.server, f.slot, "wal2json") + table_checks(f, OPTIONS) + slot_checks(f, OPTIONS)
    assert [c for c in checks if c.verdict is not Verdict.PASS] == []
    assert not failed(checks)


def test_wal_level_replica_fails_with_the_alter_system_fix() -> None:
    check = by_name(server_checks(replace(SERVER, wal_level="replica"), SLOT, "wal2json"))["wal_level"]
    assert check.verdict is Verdict.FAIL
    assert "'replica'" in check.detail
    assert check.fix is not None and "ALTER SYSTEM SET wal_level = logical;" in check.fix
    assert "restart" in check.fix


def test_no_free_slot_or_sender_fails_unless_ours_exists_and_streams() -> None:
    full = replace(SERVER, slots_used=10, senders_used=10)
    checks = by_name(server_checks(full, None, "wal2json"))
    assert checks["max_replication_slots"].verdict is Verdict.FAIL
    assert "max_replication_slots = 12" in (checks["max_replication_slots"].fix or "")
    assert checks["max_wal_senders"].verdict is Verdict.FAIL
    ours = by_name(server_checks(full, SLOT, "wal2json"))
    assert ours["max_replication_slots"].verdict is Verdict.PASS
    assert ours["max_wal_senders"].verdict is Verdict.PASS


def test_missing_replication_privilege_names_the_alter_role() -> None:
    check = by_name(server_checks(replace(SERVER, replication=False), SLOT, "wal2json"))["REPLICATION"]
    assert check.verdict is Verdict.FAIL
    assert check.fix is not None and check.fix.startswith('as a superuser: ALTER ROLE "relay" REPLICATION;')
    assert 'GRANT rds_replication TO "relay";' in check.fix  # RDS/Aurora's right


def test_output_plugin_libraries_without_wal2json_gives_the_list_syntax() -> None:
    server = replace(SERVER, plugin_libraries="pgoutput, test_decoding")
    check = by_name(server_checks(server, SLOT, "wal2json"))["output_plugin_libraries"]
    assert check.verdict is Verdict.FAIL
    assert check.fix is not None and check.fix.startswith(
        "as a superuser: ALTER SYSTEM SET output_plugin_libraries = "
        "'pgoutput', 'test_decoding', 'wal2json';")
    older = by_name(server_checks(replace(SERVER, plugin_libraries=None), SLOT, "wal2json"))
    assert older["output_plugin_libraries"].verdict is Verdict.PASS
    hidden = replace(SERVER, plugin_libraries=None, libraries_hidden=True)
    assert by_name(server_checks(hidden, SLOT, "wal2json"))[
        "output_plugin_libraries"].verdict is Verdict.SKIP  # the probe decides


def test_missing_table_and_columns_fail_with_the_init_command() -> None:
    missing = by_name(table_checks(facts(table=TableFacts(False)), OPTIONS))
    assert missing["outbox table"].verdict is Verdict.FAIL
    assert missing["outbox table"].fix == "cdc-relay init --dsn DSN --table public.outbox_events"
    debezium = replace(TABLE, columns=frozenset({"id", "aggregatetype", "aggregateid", "type",
                                                 "payload", "created_at"}))
    check = by_name(table_checks(facts(table=debezium), OPTIONS))["outbox table"]
    assert check.verdict is Verdict.FAIL and "--columns debezium" in (check.fix or "")


def test_polling_needs_update_and_the_bookkeeping_columns() -> None:
    poll = replace(OPTIONS, mode="poll")
    table = replace(TABLE, privileges={**TABLE.privileges, "UPDATE": False})
    check = by_name(table_checks(facts(table=table), poll))["table privileges"]
    assert check.verdict is Verdict.FAIL
    assert check.fix == 'GRANT UPDATE ON public.outbox_events TO "relay";'
    bare = replace(TABLE, columns=frozenset({"id", "aggregate_type", "aggregate_id", "event_type",
                                             "payload", "created_at"}))
    assert by_name(table_checks(facts(table=bare), poll))["outbox table"].verdict is Verdict.FAIL
    assert by_name(table_checks(facts(table=bare), OPTIONS))["outbox table"].verdict is Verdict.PASS


def test_pgoutput_publication_missing_is_a_failure_only_when_the_relay_cannot_create_it() -> None:
    options = replace(OPTIONS, plugin="pgoutput")
    check = by_name(table_checks(facts(), options))["publication"]
    assert check.verdict is Verdict.FAIL
    assert "CREATE PUBLICATION \"cdc_relay_outbox\" FOR TABLE public.outbox_events" in (check.fix or "")
    owner = by_name(table_checks(facts(table=replace(TABLE, owner=True)), options))["publication"]
    assert owner.verdict is Verdict.WARN
    no_inserts = by_name(table_checks(facts(publication=PublicationFacts(True, False, True)),
                                      options))["publication"]
    assert no_inserts.verdict is Verdict.FAIL and "publish = 'insert'" in (no_inserts.fix or "")


def test_slot_problems() -> None:
    assert slot_checks(facts(slot=None), OPTIONS)[0].verdict is Verdict.WARN
    other_plugin = slot_checks(facts(slot=replace(SLOT, plugin="pgoutput")), OPTIONS)[0]
    assert other_plugin.verdict is Verdict.FAIL and "cdc-relay slot drop" in (other_plugin.fix or "")
    other_db = slot_checks(facts(slot=replace(SLOT, database="other")), OPTIONS)[0]
    assert other_db.verdict is Verdict.FAIL
    lost = slot_checks(facts(slot=replace(SLOT, wal_status="lost")), OPTIONS)
    assert lost[0].verdict is Verdict.FAIL and "invalidated" in lost[0].detail


def test_wal_retention_against_max_slot_wal_keep_size() -> None:
    def retention(server: ServerFacts, slot: SlotStatus) -> Check:
        return by_name(slot_checks(facts(server=server, slot=slot), OPTIONS))["WAL retention"]

    assert retention(SERVER, SLOT).verdict is Verdict.PASS
    unlimited = retention(replace(SERVER, keep_size=-1), SLOT)
    assert unlimited.verdict is Verdict.WARN and "max_slot_wal_keep_size" in (unlimited.fix or "")
    near = retention(replace(SERVER, keep_size=2**20), replace(SLOT, retained_bytes=900_000))
    assert near.verdict is Verdict.WARN
    beyond = retention(SERVER, replace(SLOT, wal_status="unreserved"))
    assert beyond.verdict is Verdict.FAIL


def test_report_formats() -> None:
    checks = [Check("wal_level", Verdict.FAIL, "wal_level is 'replica'", "ALTER SYSTEM ..."),
              Check("broker", Verdict.SKIP, "not checked")]
    text = format_checks(checks)
    assert text.splitlines()[0].startswith("FAIL  wal_level")
    assert "fix: ALTER SYSTEM ..." in text.splitlines()[1]
    assert text.splitlines()[-1] == "doctor: 0 passed, 0 warning(s), 1 failed, 1 skipped"
    assert orjson.loads(format_checks_json(checks))[0] == {
        "name": "wal_level", "verdict": "fail", "detail": "wal_level is 'replica'",
        "fix": "ALTER SYSTEM ..."}



def test_a_low_safe_wal_size_warns_before_the_slot_is_invalidated() -> None:
    slot = replace(SLOT, retained_bytes=2**20, safe_wal_size=2**30)  # 1 GiB of 10 GiB left
    check = by_name(slot_checks(facts(slot=slot), OPTIONS))["WAL retention"]
    assert check.verdict is Verdict.WARN
    assert "safe_wal_size 1.0 GiB" in check.detail and "invalidates the slot" in check.detail
    assert "max_slot_wal_keep_size" in (check.fix or "")


def test_doctor_exits_3_for_an_unreachable_service_6_for_a_refusal_1_for_other_failures() -> None:
    from cdc_relay.errors import ExitCode
    from cdc_relay.ops.doctor.checks import sink_checks
    from cdc_relay.ops.doctor.report import exit_code
    from cdc_relay.sink.config import SinkProbe

    ok, warn = Check("a", Verdict.PASS, "ok"), Check("b", Verdict.WARN, "hm")
    wal_level = Check("wal_level", Verdict.FAIL, "replica")
    down = Check("broker", Verdict.FAIL, "cannot reach", exit_code=ExitCode.UNAVAILABLE)
    refused = Check("connection", Verdict.FAIL, "password", exit_code=ExitCode.REFUSED)
    assert exit_code([ok, warn]) == ExitCode.OK
    assert exit_code([ok, wal_level]) == ExitCode.FAILURE
    assert exit_code([wal_level, down]) == ExitCode.UNAVAILABLE
    assert exit_code([refused, wal_level, down]) == ExitCode.REFUSED
    assert exit_code([Check("x", Verdict.WARN, "w", exit_code=ExitCode.UNAVAILABLE)]) == 0
    [probe] = sink_checks([SinkProbe("nats", False, "cannot connect", "start it",
                                     ExitCode.UNAVAILABLE)])
    assert exit_code([probe]) == ExitCode.UNAVAILABLE


def test_doctors_json_report_keeps_its_four_fields() -> None:
    from cdc_relay.errors import ExitCode

    check = Check("broker", Verdict.FAIL, "down", "start it", ExitCode.UNAVAILABLE)
    assert orjson.loads(format_checks_json([check])) == [
        {"name": "broker", "verdict": "fail", "detail": "down", "fix": "start it"}]
