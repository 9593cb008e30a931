"""doctor --capture's pure checks, and the refusals of what --capture does not support yet."""

from __future__ import annotations

from dataclasses import replace

import pytest

from cdc_relay.app.capture import check_capture
from cdc_relay.capture.shape import ColumnShape, TableShape, identity_problem
from cdc_relay.config import CaptureConfig
from cdc_relay.errors import ConfigError
from cdc_relay.ops.doctor.capture import CaptureFacts, capture_checks
from cdc_relay.ops.verdicts import Verdict

ID = ColumnShape("id", 23, not_null=True)
CUSTOMERS = TableShape("public", "customers", (ID,), ("id",))
LOG = TableShape("public", "log", (ID,), (), "d")
FACTS = CaptureFacts("public.*", "pub", (CUSTOMERS,),
                     coverage=(True, frozenset({"public.customers"})))


def _by_name(facts: CaptureFacts) -> dict[str, tuple[Verdict, str, str | None]]:
    return {c.name: (c.verdict, c.detail, c.fix) for c in capture_checks(facts)}


def test_tables_with_keys_in_a_publication_of_all_changes_pass() -> None:
    checks = capture_checks(FACTS)
    assert [c.verdict for c in checks] == [Verdict.PASS] * 4
    assert checks[0].detail == "1: public.customers"


def test_a_missing_table_fails_with_the_fix() -> None:
    checks = capture_checks(replace(FACTS, shapes=(), error="captured table public.x does not exist"))
    assert [(c.name, c.verdict) for c in checks] == [("captured tables", Verdict.FAIL)]
    assert "--capture" in (checks[0].fix or "")


def test_no_key_and_default_identity_fails_naming_the_alter_table() -> None:
    verdict, detail, fix = _by_name(replace(FACTS, shapes=(CUSTOMERS, LOG)))["replica identity"]
    assert verdict is Verdict.FAIL
    assert "public.log has no primary key" in detail
    assert fix == "add a primary key, or ALTER TABLE public.log REPLICA IDENTITY FULL"


def test_replica_identity_nothing_is_a_problem_and_full_is_not() -> None:
    assert "REPLICA IDENTITY NOTHING" in (identity_problem(replace(CUSTOMERS, replica_identity="n"))
                                          or "")
    assert identity_problem(replace(LOG, replica_identity="f")) is None


def test_a_table_the_role_may_not_select_warns_with_the_grant() -> None:
    verdict, _, fix = _by_name(replace(FACTS, no_select=("public.customers",)))[
        "captured tables: SELECT"]
    assert (verdict, fix) == (Verdict.WARN, "GRANT SELECT ON public.customers TO <the relay's role>;")


def test_a_publication_the_relay_can_complete_warns_and_one_it_cannot_fails() -> None:
    missing = replace(FACTS, coverage=(False, frozenset()))
    verdict, detail, fix = _by_name(missing)["captured tables: publication"]
    assert verdict is Verdict.WARN
    assert detail == ("pub does not include public.customers; pub does not publish updates and "
                      "deletes; run and init --capture make it so on start")
    assert fix == "cdc-relay init --capture 'public.*'"
    verdict, detail, fix = _by_name(replace(missing, not_owned=("public.customers",)))[
        "captured tables: publication"]
    assert verdict is Verdict.FAIL
    assert "ALTER PUBLICATION pub ADD TABLE public.customers" in (fix or "")


def test_a_missing_publication_or_one_for_all_tables() -> None:
    assert "pub does not exist" in _by_name(replace(FACTS, coverage=None))[
        "captured tables: publication"][1]
    all_tables = replace(FACTS, coverage=(True, frozenset({"*"})))
    assert _by_name(all_tables)["captured tables: publication"][0] is Verdict.PASS


@pytest.mark.parametrize(("kwargs", "refused"), [
    ({"other_sink": True}, "a sink other than Kafka"),
    ({"message_format": "cloudevents-structured"}, "--message-format cloudevents-structured"),
])
def test_what_capture_does_not_support_yet_is_refused_in_one_line(
        kwargs: dict[str, object], refused: str) -> None:
    settings: dict[str, object] = {"snapshot": "never",
                                   "other_sink": False, "message_format": "debezium-json",
                                   **kwargs}
    with pytest.raises(ConfigError, match=refused):
        check_capture(CaptureConfig("public.t", "shop", outbox=False),
                      **settings)  # type: ignore[arg-type]


def test_with_wal2json_no_publication_is_needed_and_a_missing_identity_means_lost_updates(
        ) -> None:
    facts = replace(FACTS, coverage=None, plugin="wal2json")
    verdicts = _by_name(facts)
    assert verdicts["captured tables: publication"][0] is Verdict.PASS
    nothing = TableShape("public", "n", (), ("id",), "n")
    problem = identity_problem(nothing, "wal2json")
    assert problem is not None and "wal2json skips its UPDATE and DELETE" in problem


@pytest.mark.parametrize("outbox", [True, False])
def test_a_snapshot_of_captured_tables_is_accepted_with_or_without_the_outbox(outbox: bool) -> None:
    check_capture(CaptureConfig("public.t", "shop", outbox=outbox), snapshot="initial",
                  other_sink=False, message_format="debezium-json")
