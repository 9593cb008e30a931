"""Operations against the real services: metrics with traffic, health, status, doctor, slot drop.

Each relay here runs as a ``cdc-relay`` process with ``--metrics-port``; the test scrapes
it over HTTP like Prometheus would.
"""

from __future__ import annotations

import os
import subprocess
import time

import orjson
import psycopg
import pytest

from cdc_relay.local.broker import Broker
from cdc_relay.local.helpers import find_pg_bin_dir, free_port
from cdc_relay.local.postgres import PostgresCluster
from cdc_relay.outbox import emit
from tests.integration.wal_support import collect_ids, init_db, start_relay, write_workload
from tests.support import CliProcess, KafkaCollector, http_get, init_outbox, run_cli, scrape, wait_for

IDLE_LAG = 16 * 1024  # "about zero": background WAL (checkpoints, other tests) is small


def status_json(dsn: str, *args: str) -> dict[str, object]:
    result = run_cli("status", "--dsn", dsn, "--format", "json", *args)
    assert result.returncode == 0, result.stderr
    data: dict[str, object] = orjson.loads(result.stdout)
    return data


def test_wal_metrics_follow_real_traffic_and_lag_falls_to_zero_when_idle(
        db: str, broker: Broker, topic_prefix: str) -> None:
    init_db(db)
    port = free_port()
    with start_relay(db, broker.bootstrap, topic_prefix,
                     extra=("--metrics-port", str(port))) as relay, \
            KafkaCollector(broker.bootstrap, topic_prefix) as collector:
        wait_for(lambda: http_get(port, "/readyz")[0] == 200, timeout=30, message="readyz 200")
        assert http_get(port, "/healthz")[0] == 200
        expected = write_workload(db, transactions=25, seed=11, rollback_every=5, max_events=8)
        collect_ids(collector, topic_prefix, expected.ids)
        sent = len(expected.events)
        wait_for(lambda: scrape(port).get("outbox_events_published_total") == sent, timeout=30,
                 message=f"published counter = {sent}")
        # The lag probe runs on its own timer: wait for a reading taken after the traffic.
        # Once the relay has confirmed the idle position the slot's lag is (about) zero.
        after = time.time()
        values = wait_for(lambda: (v := scrape(port)).get(
            "cdc_relay_slot_probe_timestamp_seconds", 0) > after
            and v["cdc_relay_slot_lag_bytes"] <= IDLE_LAG and v, timeout=40, message="slot lag ~0")
        assert values["outbox_events_published_total"] == sent  # rolled-back ones never counted
        assert values["cdc_relay_inflight_events"] == 0
        assert values["cdc_relay_slot_probe_success"] == 1
        assert values["cdc_relay_slot_active"] == 1
        assert values["cdc_relay_confirmed_lsn"] > 0
        assert values["cdc_relay_replication_lag_seconds"] < 5
        assert not any(k.startswith("outbox_events_failed_total") for k in values)

        status = status_json(db)
        slot = status["slot"]
        assert isinstance(slot, dict)
        assert slot["active"] is True and isinstance(slot["active_pid"], int)
        assert slot["plugin"] == "wal2json"
        assert slot["lag_seconds"] is not None
        assert relay.stop() == 0


def test_readiness_fails_while_no_broker_answers(db: str) -> None:
    init_db(db)
    port = free_port()
    with start_relay(db, f"127.0.0.1:{free_port()}", "unused", wait=False,
                     extra=("--metrics-port", str(port))) as relay:
        wait_for(lambda: http_get(port, "/healthz")[0] == 200, timeout=30, message="healthz")
        code, body = http_get(port, "/readyz")
        # The reason must be the broker: a readiness that ignored it would say the stream
        # is not open (the loop opens the stream only once a broker answered).
        assert code == 503 and "no broker answered" in body, body
        assert "stream" not in body
        assert scrape(port)["cdc_relay_streaming"] == 0
        assert relay.stop() == 0


def test_poll_metrics_count_events_backlog_and_batches(
        db: str, broker: Broker, topic_prefix: str) -> None:
    init_outbox(db, "--no-slot")
    port = free_port()
    args = ["poll", "--dsn", db, "--brokers", broker.bootstrap, "--metrics-port", str(port),
            "--topic-pattern", topic_prefix + ".{aggregate_type}", "--interval", "200ms"]
    with CliProcess(args) as poller:
        wait_for(lambda: http_get(port, "/readyz")[0] == 200, timeout=30, message="readyz 200")
        with psycopg.connect(db) as conn:
            for n in range(30):
                emit(conn, "order", f"o-{n % 4}", "OrderPlaced", {"n": n})
        wait_for(lambda: scrape(port).get("outbox_events_published_total") == 30, timeout=30,
                 message="30 published")
        values = wait_for(lambda: (v := scrape(port)).get("outbox_events_pending") == 0 and v,
                          timeout=30, message="pending back to 0")
        assert values["outbox_batch_duration_seconds_count"] >= 1
        assert values["outbox_dead_letters"] == 0
        assert http_get(port, "/healthz")[0] == 200
        assert poller.stop() == 0


def test_status_reports_slot_and_backlog(db: str) -> None:
    init_db(db)
    with psycopg.connect(db) as conn:
        for n in range(3):
            emit(conn, "order", "o-1", "OrderPlaced", {"n": n})
    status = status_json(db)
    assert status["slot_exists"] is True
    slot = status["slot"]
    assert isinstance(slot, dict)
    assert slot["active"] is False and slot["active_pid"] is None
    assert slot["lag_seconds"] is None  # no walsender: unknown
    assert slot["lag_bytes"] > 0 and slot["retained_bytes"] >= slot["lag_bytes"]
    assert slot["wal_status"] == "reserved"
    assert status["outbox"] == {"table": "public.outbox_events", "pending": 3, "dead_letters": 0,
                                "partitioned": False, "partitions": None}
    text = run_cli("status", "--dsn", db)
    assert text.returncode == 0
    assert "inactive" in text.stdout and "pending rows       3" in text.stdout
    missing = status_json(db, "--slot", "nope")
    assert missing["slot_exists"] is False and missing["slot"] is None


def test_slot_drop_asks_first_and_refuses_without_a_terminal(db: str) -> None:
    init_db(db)
    refused = run_cli("slot", "drop", "--dsn", db, input="")
    assert refused.returncode == 2
    assert "--yes" in refused.stderr and len(refused.stderr.strip().splitlines()) == 1
    assert status_json(db)["slot_exists"] is True
    dropped = run_cli("slot", "drop", "--dsn", db, "--yes")
    assert dropped.returncode == 0, dropped.stderr
    assert status_json(db)["slot_exists"] is False
    again = run_cli("slot", "drop", "--dsn", db, "--yes")
    assert again.returncode == 1 and "no replication slot 'cdc_relay'" in again.stderr


def test_slot_drop_refuses_an_active_slot(db: str, broker: Broker, topic_prefix: str) -> None:
    init_db(db)
    with start_relay(db, broker.bootstrap, topic_prefix) as relay:
        wait_for(lambda: status_json(db)["slot"]["active"], timeout=30,  # type: ignore[index]
                 message="slot active")
        busy = run_cli("slot", "drop", "--dsn", db, "--yes")
        assert busy.returncode == 3 and "stop that relay" in busy.stderr
        assert relay.stop() == 0


# ---------------------------------------------------------------- doctor

def test_doctor_passes_on_a_healthy_database(db: str, broker: Broker) -> None:
    init_db(db)
    result = run_cli("doctor", "--dsn", db, "--brokers", broker.bootstrap)
    assert result.returncode == 0, result.stdout
    lines = result.stdout.splitlines()
    assert not [line for line in lines if line.startswith("FAIL")]
    assert any(line.startswith("PASS  plugin loads") and "temporary slot" in line for line in lines)
    assert any(line.startswith("PASS  broker") for line in lines)
    # The probe's temporary slot is gone again.
    slots = orjson.loads(run_cli("status", "--dsn", db, "--format", "json").stdout)
    assert slots["slot_exists"] is True
    with psycopg.connect(db, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pg_replication_slots"
                           " WHERE slot_name LIKE 'cdc_relay_doctor%'").fetchone()
    assert row == (0,)


def test_doctor_fails_on_wal_level_replica_and_prints_the_fix() -> None:
    with PostgresCluster(settings={"wal_level": "replica"}) as cluster:
        dsn = cluster.create_database("app")
        init_outbox(dsn, "--no-slot")
        result = run_cli("doctor", "--dsn", dsn, "--plugin", "wal2json")
        assert result.returncode == 1
        lines = result.stdout.splitlines()
        index = next(i for i, line in enumerate(lines) if line.startswith("FAIL  wal_level"))
        assert "'replica'" in lines[index]
        assert "fix: ALTER SYSTEM SET wal_level = logical;" in lines[index + 1]
        assert "restart PostgreSQL" in lines[index + 1]
        checks = orjson.loads(run_cli("doctor", "--dsn", dsn, "--plugin", "wal2json",
                                      "--format", "json").stdout)
        verdicts = {check["name"]: check["verdict"] for check in checks}
        assert verdicts["wal_level"] == "fail"
        assert verdicts["plugin loads"] == "skip"
        assert verdicts["outbox table"] == "pass"
        polling = run_cli("doctor", "--dsn", dsn, "--mode", "poll")
        assert polling.returncode == 0, polling.stdout  # polling needs no logical WAL


def test_doctor_as_a_least_privilege_role(db: str, pg_cluster: PostgresCluster) -> None:
    init_db(db)  # as the owner; the relay's role only streams and reads/updates rows
    dbname = db.split("dbname=")[1].split()[0]
    role = f"relay_{dbname}"  # roles are cluster-wide: one per test database
    pg_cluster.execute(f"CREATE ROLE {role} LOGIN REPLICATION; "
                       f"GRANT SELECT, UPDATE ON public.outbox_events TO {role}", dbname=dbname)
    try:
        result = run_cli("doctor", "--dsn", pg_cluster.dsn(dbname, user=role))
        assert result.returncode == 0, result.stdout
        lines = result.stdout.splitlines()
        # output_plugin_libraries is hidden from this role: the probe (a temporary slot,
        # allowed by REPLICATION) decides instead.
        assert any(line.startswith("PASS  plugin loads") and "temporary slot" in line
                   for line in lines), result.stdout
        pg_cluster.execute(f"ALTER ROLE {role} NOREPLICATION")
        result = run_cli("doctor", "--dsn", pg_cluster.dsn(dbname, user=role))
        assert result.returncode == 1
        assert f'fix: as a superuser: ALTER ROLE "{role}" REPLICATION;' in result.stdout
    finally:
        pg_cluster.execute(f"DROP OWNED BY {role}", dbname=dbname)
        pg_cluster.execute(f"DROP ROLE {role}")


def _server_knows(setting: str) -> bool:
    """Whether the newest installed PostgreSQL has ``setting`` (15.19+ has
    output_plugin_libraries); a server refuses to start with one it does not know."""
    bin_dir, _ = find_pg_bin_dir()
    described = subprocess.run([str(bin_dir / "postgres"), "--describe-config"],
                               capture_output=True, text=True, check=True, user="postgres"
                               if os.geteuid() == 0 else None).stdout
    return any(line.split("\t", 1)[0] == setting for line in described.splitlines())


def test_doctor_names_output_plugin_libraries_when_wal2json_is_not_allowed() -> None:
    if not _server_knows("output_plugin_libraries"):
        pytest.skip("this PostgreSQL minor has no output_plugin_libraries")
    with PostgresCluster(settings={"output_plugin_libraries": "pgoutput, test_decoding"}) as cluster:
        dsn = cluster.create_database("app")
        init_outbox(dsn, "--no-slot")
        result = run_cli("doctor", "--dsn", dsn, "--plugin", "wal2json")
        assert result.returncode == 1
        assert "FAIL  output_plugin_libraries" in result.stdout
        assert ("ALTER SYSTEM SET output_plugin_libraries = 'pgoutput', 'test_decoding', "
                "'wal2json'; SELECT pg_reload_conf();") in result.stdout
        assert "PASS  wal_level" in result.stdout
        assert run_cli("doctor", "--dsn", dsn, "--plugin", "pgoutput").returncode == 0


def test_doctor_reports_unreachable_database_and_broker_as_failed_checks_and_exits_3() -> None:
    dsn = f"host=127.0.0.1 port={free_port()} dbname=x user=u password=hunter2 connect_timeout=3"
    result = run_cli("doctor", "--dsn", dsn, "--brokers", f"127.0.0.1:{free_port()}")
    assert result.returncode == 3  # UNAVAILABLE, as docs/operations.md's exit codes say
    assert "FAIL  connection" in result.stdout and "FAIL  broker" in result.stdout
    assert "hunter2" not in result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr


@pytest.mark.parametrize("unreachable", ["postgresql", "kafka"])
def test_doctor_exits_3_when_either_service_alone_cannot_be_reached(
        unreachable: str, db: str, broker: Broker) -> None:
    init_db(db)
    dsn = unreachable_dsn() if unreachable == "postgresql" else db
    brokers = f"127.0.0.1:{free_port()}" if unreachable == "kafka" else broker.bootstrap
    result = run_cli("doctor", "--dsn", dsn, "--brokers", brokers)
    assert result.returncode == 3, result.stdout + result.stderr
    failed = [line for line in result.stdout.splitlines() if line.startswith("FAIL")]
    assert failed and failed[0].split()[1] == ("connection" if unreachable == "postgresql"
                                               else "broker"), result.stdout


# ---------------------------------------------------------------- bad input

def unreachable_dsn() -> str:
    return f"host=127.0.0.1 port={free_port()} dbname=x user=u password=hunter2 connect_timeout=3"


@pytest.mark.parametrize("args", [
    ("status",),
    ("slot", "drop", "--yes"),
    ("init",),
])
def test_unreachable_host_is_one_line_without_the_password(args: tuple[str, ...]) -> None:
    result = run_cli(*args, "--dsn", unreachable_dsn())
    assert result.returncode == 3
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "cannot connect to PostgreSQL" in result.stderr
    assert "hunter2" not in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("args", [
    ("run", "--brokers", "127.0.0.1:9"),
    ("poll", "--brokers", "127.0.0.1:9"),
])
def test_unreachable_host_is_retried_by_the_relays_one_line_per_attempt(
        args: tuple[str, ...]) -> None:
    with CliProcess([*args, "--dsn", unreachable_dsn()]) as relay:
        wait_for(lambda: relay.stderr.count("retrying in") >= 2 or not relay.running(),
                 timeout=60, message="two retry lines")
        assert relay.running(), relay.stderr
        assert relay.stop() == 0
    lines = [line for line in relay.stderr.strip().splitlines() if "cannot connect" in line]
    assert len(lines) >= 2 and all("retrying in" in line for line in lines), relay.stderr
    assert "hunter2" not in relay.stderr and "Traceback" not in relay.stderr


@pytest.mark.parametrize("args", [
    ("status", "--table", "nope"),
    ("run", "--brokers", "127.0.0.1:9", "--table", "nope"),
])
def test_missing_table_is_one_usage_line(db: str, args: tuple[str, ...]) -> None:
    result = run_cli(*args, "--dsn", db)
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "public.nope does not exist" in result.stderr and "cdc-relay init" in result.stderr


@pytest.mark.parametrize("command", [("status",), ("doctor",), ("slot", "drop"), ("run",)])
def test_unknown_option_is_one_usage_line(command: tuple[str, ...]) -> None:
    result = run_cli(*command, "--dsn", "host=x password=hunter2", "--frobnicate")
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1
    assert "--frobnicate" in result.stderr and "hunter2" not in result.stderr


def test_wrong_password_is_one_line_without_the_password(private_pg_cluster: PostgresCluster) -> None:
    cluster = private_pg_cluster
    cluster.execute("CREATE ROLE relay LOGIN REPLICATION PASSWORD 'right-horse-battery'")
    hba = cluster.data_dir / "pg_hba.conf"
    # initdb trusts everyone; ask this one role for a SCRAM password over TCP.
    hba.write_text("host all relay 127.0.0.1/32 scram-sha-256\n" + hba.read_text())
    cluster.execute("SELECT pg_reload_conf()")
    good = cluster.dsn(user="relay") + " password=right-horse-battery"
    wait_for(lambda: run_cli("status", "--dsn", cluster.dsn(user="relay") + " password=x")
             .returncode == 6, timeout=10, message="pg_hba reloaded")
    for args in (("status",), ("doctor",), ("slot", "drop", "--yes")):
        result = run_cli(*args, "--dsn", cluster.dsn(user="relay") + " password=wrong-guess-1234")
        output = result.stdout + result.stderr
        assert result.returncode in (1, 6), output  # REFUSED; doctor: a failed check
        assert "password authentication failed" in output
        assert "wrong-guess-1234" not in output and "Traceback" not in output
        if args[0] != "doctor":
            assert len(result.stderr.strip().splitlines()) == 1
    url = f"postgresql://relay:wrong-guess-1234@127.0.0.1:{cluster.port}/postgres"
    result = run_cli("status", "--dsn", url)
    assert result.returncode == 6 and "wrong-guess-1234" not in result.stderr
    # The right password gets through to the next problem: no outbox table.
    assert "does not exist" in run_cli("status", "--dsn", good).stderr
