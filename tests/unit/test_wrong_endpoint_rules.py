"""The wrong endpoint as pure verdicts: a pooler's refusal recognised, a read-only node's
line, doctor's endpoint checks and the rds_replication right. Against real servers
(pgbouncer, a hot standby): tests/integration/test_wrong_endpoint.py.
"""

from __future__ import annotations

from dataclasses import replace

import psycopg
from psycopg import errors as pgerrors

from cdc_relay.errors import ExitCode, WrongEndpoint
from cdc_relay.ops.doctor.checks import endpoint_checks, server_checks
from cdc_relay.ops.doctor.facts import (
    DoctorSettings,
    EndpointFacts,
    Facts,
    PublicationFacts,
    ServerFacts,
    TableFacts,
)
from cdc_relay.ops.verdicts import Verdict
from cdc_relay.pg.db import translate_error
from cdc_relay.pg.endpoint import (
    INIT_STANDBY_ALTERNATIVE,
    pooler_error,
    pooler_refusal,
    read_only_error,
)

SERVER = ServerFacts(version="15.20", database="app", role="relay", superuser=False,
                     replication=False, wal_level="logical", max_slots=10, max_senders=10,
                     keep_size=-1, slots_used=0, senders_used=0)
OPTIONS = DoctorSettings(dsn="host=db dbname=app")
PGBOUNCER_SAID = ('connection failed: connection to server at "10.0.0.5", port 6432 failed: '
                  'FATAL:  unsupported startup parameter: replication')


def _facts(endpoint: EndpointFacts, server: ServerFacts = SERVER) -> Facts:
    return Facts(server, TableFacts(True), PublicationFacts(False), None, endpoint=endpoint)


def test_pgbouncers_refusal_is_recognised_and_postgresqls_errors_are_not() -> None:
    assert pooler_refusal(psycopg.OperationalError(PGBOUNCER_SAID))
    assert not pooler_refusal(psycopg.OperationalError(
        'FATAL:  must be superuser or replication role to start walsender'))
    assert not pooler_refusal(psycopg.OperationalError('FATAL:  database "x" does not exist'))


def test_the_pooler_line_names_the_cause_and_the_fix_without_the_password() -> None:
    error = pooler_error("host=10.0.0.5 port=6432 dbname=app password=hunter2",
                         psycopg.OperationalError(PGBOUNCER_SAID))
    assert error.exit_code == ExitCode.USAGE and "\n" not in str(error)
    assert "10.0.0.5:6432/app is a connection pooler" in str(error)
    assert "point --dsn at PostgreSQL itself" in str(error) and "hunter2" not in str(error)


def test_a_read_only_node_is_named_with_the_writer_endpoint() -> None:
    standby = read_only_error("db:5432/app", "a hot standby or reader endpoint "
                              "(pg_is_in_recovery() is true)", "init")
    assert "writer endpoint" in str(standby) and "default_transaction_read_only" not in str(standby)
    role = read_only_error("db:5432/app", "read-only for this role or database "
                           "(default_transaction_read_only = on)", "polling")
    assert "SET default_transaction_read_only = off" in str(role)


def test_a_write_refused_as_read_only_anywhere_is_the_wrong_endpoint() -> None:
    exc = pgerrors.ReadOnlySqlTransaction("cannot execute INSERT in a read-only transaction")
    error = translate_error(exc, "recording the slot's horizon")
    assert isinstance(error, WrongEndpoint) and "primary" in str(error)


def test_doctor_fails_a_pooler_and_a_read_only_node_with_their_fixes() -> None:
    checks = {c.name: c for c in endpoint_checks(_facts(EndpointFacts(
        read_only="a hot standby or reader endpoint (pg_is_in_recovery() is true)",
        replication_error="unsupported startup parameter: replication", pooler=True,
        probed=True)), OPTIONS)}
    assert checks["replication connection"].verdict is Verdict.FAIL
    assert "not at the pooler" in (checks["replication connection"].fix or "")
    assert checks["writable"].verdict is Verdict.FAIL
    assert "writer endpoint" in (checks["writable"].fix or "")


def test_doctor_passes_a_direct_writable_primary_and_skips_the_probe_without_the_right() -> None:
    ok = endpoint_checks(_facts(EndpointFacts(probed=True), replace(SERVER, replication=True)),
                         OPTIONS)
    assert [c.verdict for c in ok] == [Verdict.PASS, Verdict.PASS]
    refused = endpoint_checks(_facts(EndpointFacts(
        probed=True, replication_error="must be superuser or replication role")), OPTIONS)
    assert refused[0].verdict is Verdict.SKIP  # the REPLICATION check says it


def test_membership_in_rds_replication_passes_the_replication_check() -> None:
    checks = {c.name: c for c in server_checks(replace(SERVER, rds_replication=True), None,
                                               "pgoutput")}
    assert checks["REPLICATION"].verdict is Verdict.PASS
    assert "rds_replication" in checks["REPLICATION"].detail


def test_init_on_a_hot_standby_names_init_on_the_primary_for_decoding_there() -> None:
    reason = "a hot standby or reader endpoint (pg_is_in_recovery() is true)"
    line = str(read_only_error("db:5432/app", reason, "init",
                               standby_alternative=INIT_STANDBY_ALTERNATIVE))
    assert "\n" not in line and "point --dsn at the primary" in line
    assert "init --dsn PRIMARY --no-slot" in line and "--primary-dsn PRIMARY" in line
    role = str(read_only_error("db:5432/app", "read-only for this role or database "
                               "(default_transaction_read_only = on)", "init",
                               standby_alternative=INIT_STANDBY_ALTERNATIVE))
    assert "--no-slot" not in role  # only a standby can decode


def test_run_on_a_hot_standby_names_primary_dsn_as_the_other_fix() -> None:
    reason = "a hot standby or reader endpoint (pg_is_in_recovery() is true)"
    line = str(read_only_error("db:5432/app", reason, "the relay", standby_alternative=True))
    assert "point --dsn at the primary" in line and "add --primary-dsn" in line
    assert "--primary-dsn" not in str(read_only_error("db:5432/app", reason, "init"))
    role = read_only_error("db:5432/app", "read-only (transaction_read_only = on)", "the relay",
                           standby_alternative=True)
    assert "--primary-dsn" not in str(role)


def test_doctor_on_a_standby_checks_feedback_and_version_for_decoding_there() -> None:
    standby = EndpointFacts(read_only="a hot standby or reader endpoint (pg_is_in_recovery() is "
                            "true)", hot_standby_feedback="on", standby_version=18)
    checks = {c.name: c for c in endpoint_checks(_facts(standby), OPTIONS)}
    assert "--primary-dsn" in checks["writable"].fix
    assert checks["standby decoding"].verdict is Verdict.PASS
    assert checks["hot_standby_feedback"].verdict is Verdict.PASS

    old = replace(standby, hot_standby_feedback="off", standby_version=15)
    checks = {c.name: c for c in endpoint_checks(_facts(old), OPTIONS)}
    assert checks["standby decoding"].verdict is Verdict.FAIL
    assert checks["hot_standby_feedback"].verdict is Verdict.FAIL
    assert "rows_removed" in checks["hot_standby_feedback"].detail
    poll = {c.name for c in endpoint_checks(_facts(standby), replace(OPTIONS, mode="poll"))}
    assert "hot_standby_feedback" not in poll
