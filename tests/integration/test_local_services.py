"""The throwaway services behave as the other integration tests assume (docs/design.md, test services)."""

from __future__ import annotations

import subprocess
import uuid

import psycopg
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from cdc_relay.errors import LocalServiceError
from cdc_relay.local.broker import Broker
from cdc_relay.local.helpers import listens_on
from cdc_relay.local.postgres import PostgresCluster
from tests.support import KafkaCollector, wait_for


def _scalar(dsn: str, sql: str) -> object:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(sql).fetchone()
        assert row is not None
        return row[0]


def test_session_cluster_has_logical_wal_and_trust_auth(pg_cluster: PostgresCluster,
                                                        db: str) -> None:
    assert _scalar(db, "SHOW wal_level") == "logical"
    assert int(str(_scalar(db, "SHOW max_replication_slots"))) >= 10
    assert _scalar(db, "SELECT current_database()") == db.split("dbname=")[1].split()[0]
    assert pg_cluster.port != 5432


def test_wal2json_slot_can_be_created_and_decodes_an_insert(pg_cluster: PostgresCluster,
                                                            db: str) -> None:
    pg_cluster.require_plugin("wal2json")
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("SELECT pg_create_logical_replication_slot('probe', 'wal2json')")
        conn.execute("CREATE TABLE t (id int primary key, note text)")
        conn.execute("INSERT INTO t VALUES (1, 'hello')")
        rows = conn.execute("SELECT data FROM pg_logical_slot_get_changes('probe', NULL, NULL,"
                            " 'format-version', '2')").fetchall()
    assert any('"action":"I"' in row[0] and "hello" in row[0] for row in rows)


def test_pgoutput_is_always_available_and_unknown_plugins_are_not(
        pg_cluster: PostgresCluster) -> None:
    assert pg_cluster.has_plugin("pgoutput")
    assert not pg_cluster.has_plugin("no_such_plugin_here")


def test_drop_database_removes_slots_held_by_an_active_walsender(
        pg_cluster: PostgresCluster) -> None:
    name = f"drop_{uuid.uuid4().hex[:8]}"
    dsn = pg_cluster.create_database(name)
    _scalar(dsn, "SELECT pg_create_logical_replication_slot('busy', 'pgoutput')")
    pg_cluster.execute("CREATE PUBLICATION everything FOR ALL TABLES", dbname=name)
    receiver = subprocess.Popen(
        [str(pg_cluster.bin_dir / "pg_recvlogical"), "-d", dsn, "--slot", "busy", "--start",
         "--no-loop", "-o", "proto_version=1", "-o", "publication_names=everything",
         "-f", "/dev/null"], stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: pg_cluster.execute(
            "SELECT active FROM pg_replication_slots WHERE slot_name = 'busy'") == "t",
            message="slot active")
        pg_cluster.drop_database(name)
        assert receiver.wait(30) != 0
    finally:
        receiver.kill()
        receiver.wait()
    assert pg_cluster.execute(f"SELECT count(*) FROM pg_database WHERE datname = '{name}'") == "0"
    assert pg_cluster.execute("SELECT count(*) FROM pg_replication_slots"
                              " WHERE slot_name = 'busy'") == "0"


def test_settings_override_the_defaults() -> None:
    with PostgresCluster(settings={"wal_level": "replica", "wal_sender_timeout": "20s"}) as pg:
        assert pg.execute("SHOW wal_level") == "replica"
        assert pg.execute("SHOW wal_sender_timeout") == "20s"
        assert pg.execute("SHOW max_wal_senders") == "20"


def test_data_survives_restart_kill_and_pause(private_pg_cluster: PostgresCluster) -> None:
    pg = private_pg_cluster
    dsn = pg.create_database("keep")
    port, data_dir = pg.port, pg.data_dir
    pg.execute("CREATE TABLE t (x int); INSERT INTO t VALUES (1)", dbname="keep")

    pg.restart("fast")
    pg.execute("INSERT INTO t VALUES (2)", dbname="keep")
    pg.restart("immediate")
    pg.execute("INSERT INTO t VALUES (3)", dbname="keep")
    pg.kill()
    pg.start()
    pg.pause()
    pg.resume()

    assert (pg.port, pg.data_dir) == (port, data_dir)
    assert _scalar(dsn, "SELECT string_agg(x::text, ',' ORDER BY x) FROM t") == "1,2,3"


def test_produced_message_is_collected_with_key_headers_and_value(broker: Broker,
                                                                  topic_prefix: str) -> None:
    producer = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True})
    producer.produce(f"{topic_prefix}.orders", key=b"o-1", value=b'{"n":1}',
                     headers=[("id", b"e-1"), ("type", b"OrderPlaced")])
    assert producer.flush(30) == 0

    with KafkaCollector(broker.bootstrap, topic_prefix) as collector:
        [msg] = collector.collect(count=1, timeout=30)
    assert (msg.topic, msg.key, msg.value) == (f"{topic_prefix}.orders", b"o-1", b'{"n":1}')
    assert msg.headers == {"id": b"e-1", "type": b"OrderPlaced"}


def test_collector_ignores_topics_of_other_prefixes(broker: Broker, topic_prefix: str) -> None:
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    producer.produce(f"{topic_prefix}x.other", value=b"not mine")
    producer.produce(f"{topic_prefix}.mine", value=b"mine")
    assert producer.flush(30) == 0

    with KafkaCollector(broker.bootstrap, f"{topic_prefix}.") as collector:
        collector.collect(count=1, timeout=30)
        messages = collector.collect(timeout=1.0)
    assert [m.value for m in messages] == [b"mine"]


def test_broker_restart_keeps_the_port_and_loses_every_topic(private_tansu: Broker,
                                                             topic_prefix: str) -> None:
    topic = f"{topic_prefix}.gone"
    producer = Producer({"bootstrap.servers": private_tansu.bootstrap})
    producer.produce(topic, value=b"x")
    assert producer.flush(30) == 0
    admin = AdminClient({"bootstrap.servers": private_tansu.bootstrap})
    assert topic in admin.list_topics(timeout=10).topics
    bootstrap = private_tansu.bootstrap

    private_tansu.restart()

    assert private_tansu.bootstrap == bootstrap
    assert topic not in AdminClient({"bootstrap.servers": bootstrap}).list_topics(
        timeout=10).topics


def test_a_broker_never_passes_off_another_brokers_port_as_its_own(broker: Broker) -> None:
    # Parallel workers pick free ports too: a port taken between the pick and the bind
    # must not look like a started broker whose answers (and pause) are another's.
    with pytest.raises(LocalServiceError) as caught:
        Broker(port=broker.port).start()
    assert "another process holds the port" in str(caught.value)
    assert listens_on(broker.pid or 0, broker.port)
