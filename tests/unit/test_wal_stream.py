"""The replication stream's error handling, without a server: libpq errors become SourceLost."""

from __future__ import annotations

import os

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from cdc_relay.config import ReplicationConfig
from cdc_relay.errors import SourceLost
from cdc_relay.model import Lsn
from cdc_relay.pg.db import plain_conninfo, replication_conninfo
from cdc_relay.wal.stream.replication import ReplicationStream


class BrokenPgconn:
    """A libpq connection whose every call fails as a dropped connection does."""

    socket = -1
    error_message = b"server closed the connection unexpectedly"

    def get_copy_data(self, async_: int) -> tuple[int, memoryview]:
        raise psycopg.OperationalError("consuming input failed: server closed the connection")

    def exec_(self, command: bytes) -> object:
        raise psycopg.OperationalError("sending query failed: server closed the connection")


def _stream() -> ReplicationStream:
    return ReplicationStream(ReplicationConfig(dsn="host=127.0.0.1 dbname=x"), [])


def test_an_operational_error_while_reading_is_a_lost_source() -> None:
    stream = _stream()
    stream._pgconn = BrokenPgconn()  # type: ignore[assignment]
    with pytest.raises(SourceLost, match="replication connection lost"):
        stream.read()


def test_an_operational_error_starting_replication_is_a_lost_source() -> None:
    with pytest.raises(SourceLost, match="START_REPLICATION failed"):
        _stream()._start_replication(BrokenPgconn())  # type: ignore[arg-type]


def test_connections_give_up_after_a_connect_timeout_unless_the_dsn_sets_one() -> None:
    assert conninfo_to_dict(replication_conninfo("host=h dbname=d"))["connect_timeout"] == "10"
    assert conninfo_to_dict(plain_conninfo("host=h dbname=d"))["connect_timeout"] == "10"
    assert conninfo_to_dict(replication_conninfo("host=h connect_timeout=3"))["connect_timeout"] == "3"
    assert "replication" not in conninfo_to_dict(plain_conninfo("host=h dbname=d"))


def test_the_walsender_gets_the_same_tcp_bounds_and_the_users_options_win() -> None:
    options = conninfo_to_dict(replication_conninfo("host=h dbname=d"))["options"]
    assert "-c tcp_user_timeout=30000" in options and "-c tcp_keepalives_idle=10" in options
    mine = conninfo_to_dict(replication_conninfo("host=h options='-c tcp_user_timeout=5000'"))
    # libpq applies -c options in order: the user's, later, overrides ours.
    assert str(mine["options"]).rindex("tcp_user_timeout=5000") > str(mine["options"]).index(
        "tcp_user_timeout=30000")


class DeadSocketPgconn:
    """Queues the status update, then the socket is gone while flushing it."""

    error_message = b""

    def __init__(self) -> None:
        read_end, write_end = os.pipe()
        os.close(read_end)
        os.close(write_end)
        self.socket = write_end  # a file descriptor that is closed now

    def put_copy_data(self, data: bytes) -> int:
        return 1

    def flush(self) -> int:
        return 1


def test_a_dead_socket_while_sending_a_status_update_is_a_lost_source() -> None:
    stream = _stream()
    pgconn = DeadSocketPgconn()
    stream._pgconn = pgconn  # type: ignore[assignment]
    stream._socket = pgconn.socket
    with pytest.raises(SourceLost):
        stream.send_status(Lsn(0))


class ClosableConnection:
    closed = False

    def close(self) -> None:
        self.closed = True


def test_closing_a_stream_that_never_used_its_handed_over_connection_closes_that_too() -> None:
    handed = ClosableConnection()
    stream = ReplicationStream(ReplicationConfig(dsn="host=127.0.0.1 dbname=x"), [],
                               position_conn=handed)  # type: ignore[arg-type]
    stream.close()
    assert handed.closed
