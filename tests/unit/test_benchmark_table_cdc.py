"""The table-CDC benchmark modes: the change mix, Debezium's plain-connector configuration,
the modes' selection and their headline table (benchmarks/table_cdc.py, plan.py, headline.py)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks import debezium, table_cdc
from benchmarks.__main__ import build_plan
from benchmarks.headline import polling_table, section, table_cdc_table, wal_table
from benchmarks.plan import DEFAULT_MODES, MODES, TABLE_CDC_MODES, parse_modes

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "bench_results.json"
DSN = "host=127.0.0.1 port=5433 dbname=bench_x user=bench password=s3cret"


@pytest.mark.parametrize("count", [20, 1_000, 50_000])
def test_the_backlog_is_half_inserts_a_third_updates_the_rest_deletes(count: int) -> None:
    assert table_cdc.mix(table_cdc.changes(count)) == {"i": 0.5, "u": 0.35, "d": 0.15}


@pytest.mark.parametrize("count", [1, 17, 19, 1_234])
def test_updates_and_deletes_only_touch_live_rows(count: int) -> None:
    ops = table_cdc.changes(count)
    assert len(ops) == count
    live: set[int] = set()
    inserted: set[int] = set()
    for op, row in ops:
        if op == "i":
            assert row not in inserted, "a new row each time"
            inserted.add(row)
            live.add(row)
        else:
            assert row in live, f"{op} of row {row}, which is not there"
            if op == "d":
                live.remove(row)


def test_the_sequence_is_the_same_every_run() -> None:
    assert table_cdc.changes(500) == table_cdc.changes(500)
    assert table_cdc.changes(40)[:20] == table_cdc.changes(20)


def test_statements_keep_the_order_one_executemany_per_run_of_one_kind() -> None:
    ops = table_cdc.changes(40)
    batches = list(table_cdc.statements(ops))
    assert [q.split()[0] for q, _ in batches] == ["INSERT", "UPDATE", "DELETE"] * 2
    assert sum(len(params) for _, params in batches) == 40
    assert [p[-1] for p in batches[2][1]] == [1, 2, 3], "deletes by primary key, oldest first"
    assert all(len(p) == 4 for p in batches[0][1]), "id, text, numeric, jsonb (timestamptz: now())"


def test_debezium_capture_runs_the_plain_connector_with_json_schemas() -> None:
    props = debezium.capture_properties(DSN, "public.bench_items", "bench", "/tmp/o.dat")
    assert not [k for k in props if k.startswith("transforms")], "no outbox router"
    assert props["topic.prefix"] == "bench"
    assert props["table.include.list"] == "public.bench_items"
    assert props["schema.include.list"] == "public"
    assert props["converter.schemas.enable"] == "true"
    assert props["snapshot.mode"] == "no_data"
    assert (props["slot.name"], props["publication.name"]) == ("cdc_relay", "cdc_relay_outbox")
    assert props["publication.autocreate.mode"] == "disabled"
    assert props["offset.flush.interval.ms"] == "0"
    assert "tombstones.on.delete" not in props, "Debezium's default: a tombstone after a delete"


def test_table_cdc_modes_run_only_when_named_or_asked_for() -> None:
    assert not set(TABLE_CDC_MODES) & set(DEFAULT_MODES)
    for name in TABLE_CDC_MODES:
        assert MODES[name].workload == "table"
        assert "--capture" in MODES[name].init_args
    assert MODES["debezium-capture"].is_debezium and MODES["capture-pgoutput"].is_relay
    assert [m.name for m in parse_modes("capture-pgoutput")] == ["capture-pgoutput"]
    plain = build_plan(Path("/tmp/x"), True, False, None, None, None, None, None, ())
    assert not [m for m in plain.modes if m.workload == "table"]
    asked = build_plan(Path("/tmp/x"), True, False, "wal-pgoutput", None, None, None, None, (),
                       table_cdc=True)
    assert [m.name for m in asked.modes] == ["wal-pgoutput", *TABLE_CDC_MODES]


def _with_table_cdc(results: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(results)
    events = max(int(t["events"]) for t in out["throughput"])
    common = {"events": events, "workload": "table", "first_event_s": 0.5, "pg_cpu_us_per_event": 4.0,
              "broker_cpu_us_per_event": 12.0, "tombstones_per_event": 0.15}
    out["throughput"] += [
        {**common, "mode": "capture-pgoutput", "eps": 30_000.0, "steady_eps": 33_000.0,
         "relay_cpu_us_per_event": 20.0, "relay_peak_rss_mb": 80.0},
        {**common, "mode": "debezium-capture", "eps": 6_000.0, "steady_eps": 7_000.0,
         "relay_cpu_us_per_event": 120.0, "relay_peak_rss_mb": 900.0},
    ]
    return out


def test_the_table_cdc_table_puts_cdc_relay_beside_debezium() -> None:
    results = _with_table_cdc(json.loads(FIXTURE.read_text()))
    table = table_cdc_table(results)
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.strip("|").split("|")]
            for line in table.splitlines()[2:]}
    assert rows["capture-pgoutput"][1:4] == ["30,000", "33,000", "5.00 x"]
    assert rows["capture-pgoutput"][5:10] == ["20.0", "4.0", "12.0", "80", "0.15"]
    assert rows["debezium-capture"][3] == "1.00 x"
    assert "**Table CDC**" in section(results)
    for other in (wal_table(results), polling_table(results)):
        assert "capture" not in other, "table-CDC rows stay out of the outbox tables"


def test_a_run_without_table_cdc_has_no_such_section() -> None:
    results = json.loads(FIXTURE.read_text())
    assert table_cdc_table(results) == ""
    assert "Table CDC" not in section(results)


def test_a_table_cdc_only_run_says_its_backlog_is_changes() -> None:
    results = _with_table_cdc(json.loads(FIXTURE.read_text()))
    assert "events (~200 B, 100 per transaction)" in section(results)
    results["throughput"] = [t for t in results["throughput"] if t.get("workload") == "table"]
    assert "changes to one table (50 % inserts, 35 % updates, 15 % deletes)" in section(results)
