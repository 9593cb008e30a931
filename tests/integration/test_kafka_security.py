"""The relay on a secured Apache Kafka: SASL_SSL (SCRAM-SHA-512, TLS from a throwaway CA)
and ACLs (StandardAuthorizer, nothing allowed without an ACL).

Each command works with exactly the ACL set docs/operations.md ("Kafka ACLs") documents
for it, and without any one of them says which permission is missing in one line: WAL
mode keeps retrying (a topic ACL is broker trouble: docs/design.md, failure rules)
without confirming past an unpublished event, and delivers everything once the ACL is
granted; what a retry cannot fix (a refused login, a transactional id or cluster ACL)
exits 6. One broker for the module (cdc_relay.local.kafka_security), a user of its own
per test; the administrator reads the topics back over its PLAINTEXT listener.

Polling mode does the same with rows: a forbidden topic leaves its events unprocessed
with no attempt counted, and publishes them once granted. The one-shot commands
(``dead-letters list --from-topic`` / ``replay``) exit 6 naming the grant; ``doctor
--brokers`` passes the broker check with a least-privilege user and names a refused login.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator

import orjson
import psycopg
import pytest
from confluent_kafka import Producer

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
from tests.support import (
    CliProcess,
    KafkaCollector,
    Msg,
    init_outbox,
    run_cli,
    skip_or_fail_in_ci,
    wait_for,
)


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


# -- polling mode ----------------------------------------------------------------------------
def poll_acls(prefix: str) -> list[Acl]:
    """``cdc-relay poll``'s ACL set: the event topics and the dead-letter topic, as run's."""
    return wal_acls(prefix)


def poller_as(kafka: SecuredKafka, dsn: str, prefix: str, user: str, password: str) -> CliProcess:
    return CliProcess(["poll", "--dsn", dsn, "--brokers", kafka.sasl_bootstrap,
                       "--topic-pattern", prefix + ".{aggregate_type}", "--message-timeout", "10s",
                       "--dead-letter-topic", f"{prefix}-dlq", "--interval", "200ms",
                       "--max-attempts", "2", "--backoff-base", "50ms", "--backoff-max", "100ms",
                       *producer_config_options(kafka, user, password)])


def emit_events(dsn: str, count: int, aggregate_type: str = "order") -> set[str]:
    with psycopg.connect(dsn) as conn:
        ids = {str(emit(conn, aggregate_type, f"a-{n % 3}", "Changed", {"n": n}))
               for n in range(count)}
        conn.commit()
    return ids


def outbox_rows(dsn: str) -> dict[str, tuple[int, bool, bool]]:
    """id -> (attempts, processed, dead-lettered)."""
    with psycopg.connect(dsn) as conn:
        return {row[0]: (row[1], row[2], row[3]) for row in conn.execute(
            "SELECT id::text, attempts, processed_at IS NOT NULL, dead_lettered_at IS NOT NULL "
            "FROM outbox_events")}


def test_poll_publishes_and_dead_letters_with_exactly_its_acl_set(
        kafka: SecuredKafka, admin: Admin, db: str, topic_prefix: str) -> None:
    init_outbox(db, "--no-slot")
    admin.create_topics(*event_topics(topic_prefix))
    user, password = admin.new_user()
    admin.grant(user, poll_acls(topic_prefix))
    ids = emit_events(db, 12)
    poison = emit_events(db, 1, "bad type!")
    with poller_as(kafka, db, topic_prefix, user, password) as poller, \
            KafkaCollector(kafka.bootstrap, topic_prefix) as collector:
        messages = collect_ids(collector, topic_prefix, ids | poison)
        wait_for(lambda: {i for i, r in outbox_rows(db).items() if r[1]} == ids, timeout=60,
                 message="every event marked processed")
        assert poller.stop() == 0, poller.stderr
    assert ids_on(messages, f"{topic_prefix}-dlq") == poison
    assert {i for i, r in outbox_rows(db).items() if r[2]} == poison
    assert "not authorized" not in poller.stderr and "Traceback" not in poller.stderr


def test_poll_without_write_on_the_event_topics_names_the_grant_burns_no_attempt_and_publishes_once_granted(
        kafka: SecuredKafka, admin: Admin, db: str, topic_prefix: str) -> None:
    init_outbox(db, "--no-slot")
    admin.create_topics(*event_topics(topic_prefix))
    user, password = admin.new_user()
    acls = poll_acls(topic_prefix)
    absent = acls.pop(0)
    admin.grant(user, acls)
    ids = emit_events(db, 8)
    with poller_as(kafka, db, topic_prefix, user, password) as poller, \
            KafkaCollector(kafka.bootstrap, topic_prefix) as collector:
        fix = f"grant WRITE on TOPIC {topic_prefix}.order"
        wait_for(lambda: poller.stderr.count(fix) >= 2 or not poller.running(), timeout=60,
                 message=f"the poller saying {fix!r} twice (a retry)")
        assert poller.running(), poller.stderr
        line = next(line for line in poller.stderr.splitlines() if fix in line)
        assert "not authorized to write to topic" in line and "no attempt counted" in line, line
        assert "Traceback" not in poller.stderr
        assert outbox_rows(db) == {i: (0, False, False) for i in ids}  # unprocessed, no attempt
        admin.grant(user, [absent])
        messages = collect_ids(collector, topic_prefix, ids)
        wait_for(lambda: all(r[1] for r in outbox_rows(db).values()), timeout=60,
                 message="every event marked processed")
        assert poller.stop() == 0, poller.stderr
    assert ids_on(messages, f"{topic_prefix}.order") == ids
    assert {r[0] for r in outbox_rows(db).values()} == {0}


def test_poll_without_write_on_the_dead_letter_topic_names_the_grant_and_keeps_the_row_as_the_dead_letter(
        kafka: SecuredKafka, admin: Admin, db: str, topic_prefix: str) -> None:
    init_outbox(db, "--no-slot")
    admin.create_topics(*event_topics(topic_prefix))
    user, password = admin.new_user()
    acls = poll_acls(topic_prefix)
    absent = acls.pop(1)
    admin.grant(user, acls)
    ids = emit_events(db, 5)
    [poison] = emit_events(db, 1, "bad type!")
    dlq = f"{topic_prefix}-dlq"
    with poller_as(kafka, db, topic_prefix, user, password) as poller, \
            KafkaCollector(kafka.bootstrap, topic_prefix) as collector:
        collect_ids(collector, topic_prefix, ids)
        fix = f"grant WRITE on TOPIC {dlq}"
        wait_for(lambda: fix in poller.stderr or not poller.running(), timeout=60,
                 message=f"the poller saying {fix!r}")
        assert poller.running(), poller.stderr
        line = next(line for line in poller.stderr.splitlines() if fix in line)
        assert f"dead letter not copied to {dlq}: not authorized to write" in line, line
        assert "Traceback" not in poller.stderr
        assert outbox_rows(db)[poison] == (2, False, True)  # the row is the dead letter of record
        listed = run_cli("dead-letters", "list", "--dsn", db, "--format", "json")
        assert [row["id"] for row in orjson.loads(listed.stdout)] == [poison]
        # Granted, a retried dead letter is copied to the topic (the copy is best effort).
        admin.grant(user, [absent])
        assert run_cli("dead-letters", "retry", "--dsn", db, "--all").returncode == 0
        messages = collect_ids(collector, topic_prefix, {poison})
        assert poller.stop() == 0, poller.stderr
    assert ids_on(messages, dlq) == {poison}


# -- dead-letters list --from-topic / replay -------------------------------------------------
DEAD_LETTER_GROUP = "cdc-relay-dead-letters"


def dead_letter_acls(prefix: str) -> list[Acl]:
    """``dead-letters list --from-topic`` / ``replay``'s ACL set (the list needs the first two)."""
    return [Acl("READ", "TOPIC", f"{prefix}-dlq"), Acl("DESCRIBE", "GROUP", DEAD_LETTER_GROUP),
            Acl("WRITE", "TOPIC", f"{prefix}.", "PREFIXED")]


def write_dead_letter(kafka: SecuredKafka, prefix: str) -> str:
    """One dead letter as WAL mode writes it, produced by the administrator."""
    event_id = str(uuid.uuid4())
    producer = Producer({"bootstrap.servers": kafka.bootstrap})
    producer.produce(f"{prefix}-dlq", b'{"n": 1}', b"o-1", headers=[
        ("id", event_id.encode()), ("event_type", b"Placed"), ("aggregate_type", b"order"),
        ("error", b"MSG_SIZE_TOO_LARGE"), ("original_topic", f"{prefix}.order".encode())])
    assert producer.flush(30) == 0
    return event_id


def collect_on(collector: KafkaCollector, topic: str, event_id: str) -> list[Msg]:
    """Read until ``event_id`` arrived on ``topic`` (its dead letter is there from the start)."""
    return collector.collect(until=lambda ms: event_id in ids_on(ms, topic), timeout=60)


def dead_letters_as(kafka: SecuredKafka, prefix: str, user: str, password: str,
                    command: str) -> tuple[int, str, str]:
    args = ("--from-topic", f"{prefix}-dlq", "--brokers", kafka.sasl_bootstrap,
            *producer_config_options(kafka, user, password))
    if command == "list":
        result = run_cli("dead-letters", "list", *args, "--format", "json")
    else:
        result = run_cli("dead-letters", "replay", *args, "--all",
                         "--topic-pattern", prefix + ".{aggregate_type}")
    return result.returncode, result.stdout, result.stderr


def test_dead_letters_list_and_replay_work_with_exactly_their_acl_set(
        kafka: SecuredKafka, admin: Admin, topic_prefix: str) -> None:
    admin.create_topics(*event_topics(topic_prefix))
    event_id = write_dead_letter(kafka, topic_prefix)
    user, password = admin.new_user()
    admin.grant(user, dead_letter_acls(topic_prefix))
    with KafkaCollector(kafka.bootstrap, topic_prefix) as collector:
        code, out, err = dead_letters_as(kafka, topic_prefix, user, password, "list")
        assert code == 0, err
        assert [row["id"] for row in orjson.loads(out)] == [event_id]
        code, out, err = dead_letters_as(kafka, topic_prefix, user, password, "replay")
        assert code == 0, err
        assert f"replayed {event_id} to {topic_prefix}.order" in out
        messages = collect_on(collector, f"{topic_prefix}.order", event_id)
    assert sorted(m.topic for m in messages if m.headers["id"].decode() == event_id) == [
        f"{topic_prefix}-dlq", f"{topic_prefix}.order"]


@pytest.mark.parametrize("missing", [0, 1, 2, 3], ids=[
    "dead-letter-topic-read", "reader-group-describe", "event-topics-write",
    "event-topics-write-but-dead-letter-topic-write"])
def test_dead_letters_without_one_acl_name_it_and_replay_sends_once_granted(
        kafka: SecuredKafka, admin: Admin, topic_prefix: str, missing: int) -> None:
    admin.create_topics(*event_topics(topic_prefix))
    event_id = write_dead_letter(kafka, topic_prefix)
    user, password = admin.new_user()
    acls = dead_letter_acls(topic_prefix)
    absent = acls.pop(min(missing, 2))
    if missing == 3:  # the run user's WRITE on the dead-letter topic: idempotence is allowed
        acls.append(Acl("WRITE", "TOPIC", f"{topic_prefix}-dlq"))
    admin.grant(user, acls)
    fix = f"grant {absent.operation} on {absent.resource} {absent.name}"
    with KafkaCollector(kafka.bootstrap, topic_prefix) as collector:
        listed = dead_letters_as(kafka, topic_prefix, user, password, "list")
        replayed = dead_letters_as(kafka, topic_prefix, user, password, "replay")
        for code, _out, err in ([replayed] if missing >= 2 else [listed, replayed]):
            assert "Traceback" not in err
            line = _one_error_line(err)
            if missing == 3:  # the broker refused that one message: exit 6, one line per event
                assert code == 6, err
                assert f"{event_id} not replayed to {topic_prefix}.order: not authorized" in line
                assert f"grant WRITE on TOPIC {topic_prefix}.order" in line, line
            elif missing == 2:  # no WRITE on any topic: the idempotent producer is refused,
                # or - when librdkafka's cached topic metadata fails the message before its
                # producer id request is answered - the message itself: either names the grant
                assert code == 6, err
                assert ("refused the relay's idempotent producer" in line
                        or f"{event_id} not replayed to {topic_prefix}.order" in line), line
                assert "grant WRITE on TOPIC" in line and f"TOPIC {topic_prefix}.order" in line
            else:
                assert code == 6, err
                assert fix in line, line
        if missing >= 2:
            assert listed[0] == 0, listed[2]
        admin.grant(user, [absent])
        code, _out, err = dead_letters_as(kafka, topic_prefix, user, password, "replay")
        assert code == 0, err
        messages = collect_on(collector, f"{topic_prefix}.order", event_id)
        # The refused replay sent nothing: one copy in the event topic.
        assert sorted(m.topic for m in messages if m.headers["id"].decode() == event_id) == [
            f"{topic_prefix}-dlq", f"{topic_prefix}.order"]


# -- doctor --brokers ------------------------------------------------------------------------
def doctor_broker_check(kafka: SecuredKafka, dsn: str, user: str, password: str) -> dict[str, str]:
    result = run_cli("doctor", "--dsn", dsn, "--brokers", kafka.sasl_bootstrap, "--format", "json",
                     *producer_config_options(kafka, user, password))
    assert "Traceback" not in result.stderr, result.stderr
    checks = orjson.loads(result.stdout)
    assert all(password not in str(check) for check in checks)
    [broker] = [check for check in checks if check["name"] == "broker"]
    return {key: str(value) for key, value in broker.items()}


def test_doctor_passes_the_broker_check_with_the_run_users_least_privilege_acls(
        kafka: SecuredKafka, admin: Admin, db: str, topic_prefix: str) -> None:
    init_db(db)
    user, password = admin.new_user()
    admin.grant(user, wal_acls(topic_prefix))
    broker = doctor_broker_check(kafka, db, user, password)
    assert broker["verdict"] == "pass", broker


def test_doctor_with_a_wrong_password_says_the_broker_refused_the_login(
        kafka: SecuredKafka, admin: Admin, db: str, topic_prefix: str) -> None:
    init_db(db)
    user, password = admin.new_user()
    admin.grant(user, wal_acls(topic_prefix))
    broker = doctor_broker_check(kafka, db, user, "wrong-" + password)
    assert broker["verdict"] == "fail", broker
    assert "refused the relay" in broker["detail"] and "SASL" in broker["detail"], broker
    assert "sasl.password" in broker["fix"], broker
