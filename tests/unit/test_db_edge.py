"""``cdc_relay.pg.db``: connection failures and error messages, without a database."""

from __future__ import annotations

import socket

import pytest
from psycopg import errors as pgerrors

from cdc_relay.errors import (
    ConfigError,
    DatabaseError,
    ServiceUnavailable,
    SlotBusy,
)
from cdc_relay.pg.db import connect, describe_dsn, translate_error
from cdc_relay.wal.slot.lifecycle import _slot_error


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_connection_refused_names_the_server_but_not_the_password() -> None:
    port = _closed_port()
    with pytest.raises(ServiceUnavailable) as info:
        connect(f"postgresql://app:s3cret@127.0.0.1:{port}/orders")
    message = str(info.value)
    assert message.startswith(f"cannot connect to PostgreSQL at 127.0.0.1:{port}/orders: ")
    assert "Connection refused" in message
    assert "s3cret" not in message
    assert "\n" not in message


def test_malformed_dsn_is_a_config_error_without_the_password() -> None:
    with pytest.raises(ConfigError, match="invalid DSN") as info:
        connect("host=x password=s3cret bogus_option=1")
    assert "s3cret" not in str(info.value)


@pytest.mark.parametrize(
    ("dsn", "expected"),
    [
        ("host=db.example port=6432 dbname=app user=u password=p", "db.example:6432/app"),
        ("postgresql://u:p@h/app", "h:5432/app"),
        ("dbname=app", "local socket:5432/app"),
        ("not a dsn", "<invalid DSN>"),
    ],
)
def test_describe_dsn(dsn: str, expected: str) -> None:
    assert describe_dsn(dsn) == expected


def test_wal_level_error_says_how_to_fix_it() -> None:
    exc = pgerrors.ObjectNotInPrerequisiteState(
        "logical decoding requires wal_level >= logical")
    error = translate_error(exc, "creating replication slot 'x'")
    assert isinstance(error, DatabaseError)
    assert "ALTER SYSTEM SET wal_level = logical" in str(error)
    assert "restart" in str(error)


def test_busy_slot_is_slot_busy() -> None:
    exc = pgerrors.ObjectInUse('replication slot "x" is active for PID 42')
    assert isinstance(translate_error(exc, "dropping replication slot 'x'"), SlotBusy)


def test_slot_limit_says_how_to_fix_it() -> None:
    exc = pgerrors.ConfigurationLimitExceeded("all replication slots are in use")
    assert "max_replication_slots" in str(translate_error(exc, "creating slot"))


def test_missing_replication_privilege_says_how_to_fix_it() -> None:
    exc = pgerrors.InsufficientPrivilege(
        "permission denied to use replication slots")
    assert "ALTER ROLE <user> REPLICATION" in str(translate_error(exc, "creating slot"))


def test_uninstalled_wal2json_says_which_package_to_install() -> None:
    exc = pgerrors.UndefinedFile('could not access file "wal2json": No such file or directory')
    message = str(_slot_error(exc, "cdc_relay", "wal2json"))
    assert "install postgresql-<version>-wal2json" in message
    assert "apt-get install postgresql-15-wal2json" in message
    assert "--plugin pgoutput" in message


def test_other_errors_are_database_errors_with_masked_secrets() -> None:
    exc = pgerrors.SyntaxError("oops near password=hunter2")
    error = translate_error(exc, "doing x")
    assert type(error) is DatabaseError
    assert "hunter2" not in str(error)
    assert "SQLSTATE 42601" in str(error)
