"""The relay on a secured Apache Kafka: SASL_SSL (SCRAM-SHA-512, TLS from a throwaway CA)
and ACLs (StandardAuthorizer, nothing allowed without an ACL).

Each command works with exactly the ACL set docs/operations.md ("Kafka ACLs") documents
for it, and without any one of them says which permission is missing in one line: WAL
mode keeps retrying (a topic ACL is broker trouble: docs/design.md, failure rules)
without confirming past an unpublished event, and delivers everything once the ACL is
granted; what a retry cannot fix (a refused login, a transactional id or cluster ACL)
exits 6. One broker for the module (cdc_relay.local.kafka_security), a user of its own
per test; the administrator reads the topics back over its PLAINTEXT listener.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import psycopg
import pytest

from cdc_relay.local.apache_kafka import cache_root, has_jars, jar_dir
from cdc_relay.local.kafka_security import SecuredKafka
from cdc_relay.outbox import emit
from tests.integration.eos_support import (
    READ_COMMITTED,
    assert_exactly_once,
    collect_exactly,
    start_eos_relay,
)
from tests.integration.security_support import Acl, Admin, producer_config_options
from tests.integration.wal_support import (
    Expected,
    assert_contract,
    collect_ids,
    confirmed_flush,
    init_db,
    lsn_int,
    start_relay,
    write_workload,
)
from tests.support import CliProcess, KafkaCollector, Msg, skip_or_fail_in_ci, wait_for


@pytest.fixture(scope="module")
def kafka() -> Iterator[SecuredKafka]:
    """A secured Apache Kafka 4.1 for this module's tests."""
    if shutil.which("java") is None:
        skip_or_fail_in_ci("Apache Kafka needs Java 17+ (apt-get install openjdk-17-jre-headless)")
    if not has_jars(jar_dir("4.1.2", cache_root()), "4.1.2") and shutil.which("mvn") is None:
        skip_or_fail_in_ci("Apache Kafka's jars are not cached and Maven is missing: "
                           "python -m cdc_relay.local.apache_kafka fetch")
    broker = SecuredKafka()
    try:
        broker.start()
        yield broker
    finally:
        broker.cleanup()


@pytest.fixture(scope="module")
def admin(kafka: SecuredKafka) -> Admin:
    return Admin(kafka)


def wal_acls(prefix: str) -> list[Acl]:
    """``cdc-relay run``'s ACL set (docs/operations.md, Kafka ACLs), topics made by the admin."""
    return [Acl("WRITE", "TOPIC", f"{prefix}.", "PREFIXED"), Acl("WRITE", "TOPIC", f"{prefix}-dlq")]


def event_topics(prefix: str) -> list[str]:
    return [f"{prefix}.{kind}" for kind in ("order", "customer", "invoice")] + [f"{prefix}-dlq"]


def dead_lettered_event(dsn: str, expected: Expected) -> str:
    """Commit one event whose topic name Kafka refuses: the relay dead-letters it."""
    with psycopg.connect(dsn) as conn:
        event_id = str(emit(conn, "bad type!", "b-1", "Weird", {"n": 1}))
        conn.commit()
        row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
    assert row is not None
    expected.commit_lsn[event_id] = lsn_int(row[0])
    return event_id


def relay_as(kafka: SecuredKafka, dsn: str, prefix: str, user: str, password: str,
             *extra: str, wait: bool = True) -> CliProcess:
    return start_relay(dsn, kafka.sasl_bootstrap, prefix, wait=wait, extra=(
        *producer_config_options(kafka, user, password), "--dead-letter-topic", f"{prefix}-dlq", *extra))


def ids_on(messages: list[Msg], topic: str) -> set[str]:
    return {m.headers["id"].decode() for m in messages if m.topic == topic}


def _one_error_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    return lines[-1]


# -- WAL mode --------------------------------------------------------------------------------
def test_run_delivers_every_event_and_dead_letter_with_exactly_its_acl_set(
        kafka: SecuredKafka, admin: Admin, db: str, topic_prefix: str) -> None:
    init_db(db)
    admin.create_topics(*event_topics(topic_prefix))
    user, password = admin.new_user()
    admin.grant(user, wal_acls(topic_prefix))
    with relay_as(kafka, db, topic_prefix, user, password) as relay, \
            KafkaCollector(kafka.bootstrap, topic_prefix) as collector:
        expected = write_workload(db, transactions=6, seed=42)
        dead = dead_lettered_event(db, expected)
        messages = collect_ids(collector, topic_prefix, expected.ids | {dead})
        assert relay.stop() == 0, relay.stderr
    assert dead in ids_on(messages, f"{topic_prefix}-dlq")
    assert_contract([m for m in messages if m.topic != f"{topic_prefix}-dlq"], expected, topic_prefix)


@pytest.mark.parametrize("missing", [0, 1], ids=["event-topics-write", "dead-letter-topic-write"])
def test_run_without_one_acl_names_it_retries_confirms_nothing_past_it_and_delivers_once_granted(
        kafka: SecuredKafka, admin: Admin, db: str, topic_prefix: str, missing: int) -> None:
    init_db(db)
    admin.create_topics(*event_topics(topic_prefix))
    user, password = admin.new_user()
    acls = wal_acls(topic_prefix)
    absent = acls.pop(missing)
    admin.grant(user, acls)
    with relay_as(kafka, db, topic_prefix, user, password) as relay, \
            KafkaCollector(kafka.bootstrap, topic_prefix) as collector:
        expected = write_workload(db, transactions=3, seed=7, rollback_every=0)
        dead = dead_lettered_event(db, expected)
        refused = f"not authorized to write to topic {absent.name}"
        wait_for(lambda: refused in relay.stderr or not relay.running(), timeout=60,
                 message="the line naming the missing ACL")
        assert relay.running(), relay.stderr
        line = next(line for line in relay.stderr.splitlines() if refused in line)
        assert f"grant WRITE on TOPIC {absent.name}" in line, line
        assert "Traceback" not in relay.stderr
        unpublished = expected.ids | {dead} if missing == 0 else {dead}
        assert confirmed_flush(db) < min(expected.commit_lsn[i] for i in unpublished)
        admin.grant(user, [absent])
        messages = collect_ids(collector, topic_prefix, expected.ids | {dead})
        assert relay.stop() == 0, relay.stderr
    assert dead in ids_on(messages, f"{topic_prefix}-dlq")


def test_a_wrong_password_exits_6_with_one_line_and_no_password(
        kafka: SecuredKafka, admin: Admin, db: str, topic_prefix: str) -> None:
    init_db(db)
    user, password = admin.new_user()
    admin.grant(user, wal_acls(topic_prefix))
    wrong = "wrong-" + password
    relay = relay_as(kafka, db, topic_prefix, user, wrong, wait=False)
    try:
        relay.proc.wait(60)
    finally:
        relay.kill()
    assert relay.proc.returncode == 6, relay.stderr
    line = _one_error_line(relay.stderr)
    assert "refused the relay" in line and "SASL" in line.upper(), line
    assert wrong not in relay.stderr + relay.stdout and password not in relay.stderr + relay.stdout


# -- exactly-once ----------------------------------------------------------------------------
def transactional_id(dsn: str, slot: str = "cdc_relay") -> str:
    """The relay's transactional.id: ``cdc-relay.<system identifier>.<slot>`` (docs/exactly-once.md)."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT system_identifier::text FROM pg_control_system()").fetchone()
    assert row is not None
    return f"cdc-relay.{row[0]}.{slot}"


def eos_acls(prefix: str, dsn: str) -> list[Acl]:
    """``run --exactly-once``'s ACL set: run's, the transactional id, the checkpoint topic."""
    checkpoints = f"cp-{prefix}"
    return [*wal_acls(prefix), Acl("WRITE", "TRANSACTIONAL_ID", transactional_id(dsn, f"s_{prefix}")),
            Acl("READ", "TOPIC", checkpoints), Acl("WRITE", "TOPIC", checkpoints),
            Acl("DESCRIBE_CONFIGS", "TOPIC", checkpoints),
            Acl("DESCRIBE", "GROUP", "cdc-relay-checkpoint-reader")]


def eos_relay_as(kafka: SecuredKafka, dsn: str, prefix: str, user: str, password: str,
                 wait: bool = True) -> CliProcess:
    return start_eos_relay(dsn, kafka.sasl_bootstrap, prefix, wait=wait, extra=(
        *producer_config_options(kafka, user, password), "--dead-letter-topic", f"{prefix}-dlq",
        "--checkpoint-topic", f"cp-{prefix}", "--slot", f"s_{prefix}"))


def prepare_eos(admin: Admin, dsn: str, prefix: str) -> None:
    """A slot of the test's own: the transactional id is per system and slot, and the
    module's other tests share the PostgreSQL cluster."""
    init_db(dsn, slot=f"s_{prefix}")
    admin.create_topics(*event_topics(prefix))
    admin.create_topics(f"cp-{prefix}", config={"cleanup.policy": "compact"})


def test_run_exactly_once_delivers_each_event_once_with_exactly_its_acl_set(
        kafka: SecuredKafka, admin: Admin, db: str, topic_prefix: str) -> None:
    prepare_eos(admin, db, topic_prefix)
    user, password = admin.new_user()
    admin.grant(user, eos_acls(topic_prefix, db))
    with eos_relay_as(kafka, db, topic_prefix, user, password) as relay, \
            KafkaCollector(kafka.bootstrap, topic_prefix, config=READ_COMMITTED) as collector:
        expected = write_workload(db, transactions=6, seed=5)
        messages = collect_exactly(collector, expected)
        assert relay.stop() == 0, relay.stderr
    assert_exactly_once(messages, expected)


@pytest.mark.parametrize("missing", [2, 3, 4, 5, 6], ids=[
    "transactional-id-write", "checkpoint-read", "checkpoint-write", "checkpoint-describe-configs",
    "checkpoint-reader-group-describe"])
def test_run_exactly_once_without_one_acl_names_it_and_confirms_nothing_past_it(
        kafka: SecuredKafka, admin: Admin, db: str, topic_prefix: str, missing: int) -> None:
    prepare_eos(admin, db, topic_prefix)
    user, password = admin.new_user()
    acls = eos_acls(topic_prefix, db)
    absent = acls.pop(missing)
    expected = Expected()
    if absent.operation == "READ" or absent.resource == "GROUP":
        # The checkpoint topic is read only once it holds a checkpoint: one run makes it.
        admin.grant(user, [*acls, absent])
        with eos_relay_as(kafka, db, topic_prefix, user, password) as first, \
                KafkaCollector(kafka.bootstrap, topic_prefix, config=READ_COMMITTED) as collector:
            write_workload(db, transactions=2, seed=8, rollback_every=0, expected=expected)
            collect_exactly(collector, expected)
            assert first.stop() == 0, first.stderr
        admin.revoke_all(user)
        expected.commit_lsn.clear()
    admin.grant(user, acls)
    fix = f"grant {absent.operation} on {absent.resource} {absent.name}"
    relay = eos_relay_as(kafka, db, topic_prefix, user, password, wait=False)
    with relay, KafkaCollector(kafka.bootstrap, topic_prefix, config=READ_COMMITTED) as collector:
        write_workload(db, transactions=3, seed=9, rollback_every=0, expected=expected)
        wait_for(lambda: fix in relay.stderr or not relay.running(), timeout=60,
                 message=f"a line saying {fix!r}")
        assert "Traceback" not in relay.stderr
        assert confirmed_flush(db, f"s_{topic_prefix}") < min(expected.commit_lsn.values())
        if absent.resource == "TRANSACTIONAL_ID":  # a refusal a retry cannot fix: exit 6
            assert relay.proc.wait(30) == 6, relay.stderr
            assert fix in _one_error_line(relay.stderr)
            admin.grant(user, [absent])
            relay = eos_relay_as(kafka, db, topic_prefix, user, password)
        else:  # a topic ACL: retried, delivered once granted
            assert relay.running(), relay.stderr
            admin.grant(user, [absent])
        with relay:
            assert_exactly_once(collect_exactly(collector, expected), expected)
            assert relay.stop() == 0, relay.stderr
