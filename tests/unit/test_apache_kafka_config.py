"""The JVM-free parts of cdc_relay.local.apache_kafka and kafka_files: the jar cache,
server.properties, the JVM and Maven command lines, the Metadata probe's bytes."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from cdc_relay.errors import LocalServiceError
from cdc_relay.local.apache_kafka import ApacheKafka, metadata_request, parse_metadata_brokers
from cdc_relay.local.kafka_files import (
    BASE_PROPERTIES,
    DEFAULT_VERSION,
    FAST_START_FLAG,
    KAFKA_3_9,
    KAFKA_4_1,
    LOG4J2_CONFIG,
    POM,
    cache_root,
    ensure_jars,
    has_jars,
    jar_dir,
    jvm_command,
    maven_command,
    maven_failure,
    render_properties,
    server_properties,
)

_BINDING = ("log4j-api-2.24.3.jar", "log4j-core-2.24.3.jar", "log4j-slf4j2-impl-2.24.3.jar",
            "slf4j-api-2.0.17.jar")


def _fill(lib: Path, version: str) -> Path:
    lib.mkdir(parents=True, exist_ok=True)
    for name in (f"kafka_2.13-{version}.jar", f"kafka-clients-{version}.jar", *_BINDING):
        (lib / name).write_bytes(b"PK")
    return lib


def _script(directory: Path, name: str, body: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / name).write_text(f"#!/bin/sh\n{body}\n")
    (directory / name).chmod(0o755)


# -- the cache -------------------------------------------------------------------------------
def test_the_cache_is_under_the_home_unless_the_variable_says_otherwise(tmp_path: Path) -> None:
    assert cache_root({}) == Path.home() / ".cache" / "cdc-relay" / "kafka"
    assert cache_root({"CDC_RELAY_KAFKA_CACHE": ""}) == Path.home() / ".cache" / "cdc-relay" / "kafka"
    assert cache_root({"CDC_RELAY_KAFKA_CACHE": str(tmp_path)}) == tmp_path
    assert jar_dir("4.1.2", tmp_path) == tmp_path / "4.1.2" / "lib"


def test_a_jar_dir_is_complete_with_the_broker_of_its_version_and_the_log4j2_binding(tmp_path: Path) -> None:
    lib = _fill(tmp_path / "lib", KAFKA_4_1)
    assert has_jars(lib, KAFKA_4_1)
    assert not has_jars(lib, KAFKA_3_9)
    (lib / "log4j-slf4j2-impl-2.24.3.jar").unlink()
    assert not has_jars(lib, KAFKA_4_1)
    assert not has_jars(tmp_path / "missing", KAFKA_4_1)


def test_cached_jars_need_no_maven(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    lib = _fill(jar_dir(KAFKA_4_1, tmp_path), KAFKA_4_1)
    assert ensure_jars(KAFKA_4_1, tmp_path) == lib


def test_missing_maven_is_one_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(LocalServiceError, match=r"^mvn is not on PATH: .*apt-get install maven"):
        ensure_jars(KAFKA_4_1, tmp_path)


def test_missing_java_is_one_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _script(tmp_path / "bin", "mvn", "exit 0")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    with pytest.raises(LocalServiceError, match=r"^java is not on PATH: .*Java 17"):
        ensure_jars(KAFKA_4_1, tmp_path / "cache")


def test_maven_fills_the_cache_once_and_atomically(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = tmp_path / "calls"
    jars = " ".join(f'"$out/{name}"' for name in (f"kafka_2.13-{KAFKA_3_9}.jar", *_BINDING))
    _script(tmp_path / "bin", "java", "exit 0")
    _script(tmp_path / "bin", "mvn", f'echo "$@" >> {calls}\n'
            'for arg; do case "$arg" in -DoutputDirectory=*) out="${arg#*=}";; esac; done\n'
            f"for jar in {jars}; do : > \"$jar\"; done")  # no touch: PATH holds only the fakes
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    cache = tmp_path / "cache"
    lib = ensure_jars(KAFKA_3_9, cache)
    assert lib == jar_dir(KAFKA_3_9, cache)
    assert has_jars(lib, KAFKA_3_9)
    assert ensure_jars(KAFKA_3_9, cache) == lib
    assert len(calls.read_text().splitlines()) == 1
    assert f"-Dkafka.version={KAFKA_3_9}" in calls.read_text()
    assert sorted(p.name for p in (cache / KAFKA_3_9).iterdir()) == [".lock", "lib"]


def test_a_maven_failure_is_one_line_and_leaves_nothing(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    _script(tmp_path / "bin", "java", "exit 0")
    _script(tmp_path / "bin", "mvn", "echo '[ERROR] Failed to execute goal: Could not resolve kafka_2.13'\n"
            "echo '[ERROR] -> [Help 1]'\nexit 1")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    with pytest.raises(LocalServiceError) as raised:
        ensure_jars(KAFKA_4_1, tmp_path / "cache")
    assert str(raised.value) == (f"Maven could not fetch Apache Kafka {KAFKA_4_1}'s jars (exit 1): "
                                 "[ERROR] Failed to execute goal: Could not resolve kafka_2.13")
    assert [p.name for p in (tmp_path / "cache" / KAFKA_4_1).iterdir()] == [".lock"]


def test_maven_failure_strips_colours_and_falls_back_to_any_line() -> None:
    assert maven_failure("4.1.2", 1, "\x1b[1;31m[ERROR]\x1b[m no network\n").endswith(": [ERROR] no network")
    assert maven_failure("4.1.2", 137, "\nKilled\n").endswith("(exit 137): Killed")
    assert maven_failure("4.1.2", 1, "").endswith("(exit 1): no output")


def test_maven_runs_quietly_in_batch_mode_on_the_shipped_pom(tmp_path: Path) -> None:
    argv = maven_command("mvn", "3.9.2", tmp_path)
    assert argv[:3] == ["mvn", "-B", "-q"]
    assert argv[argv.index("-f") + 1] == str(POM)
    assert "-Dkafka.version=3.9.2" in argv
    assert argv[-2:] == ["dependency:copy-dependencies", f"-DoutputDirectory={tmp_path}"]


def test_the_pom_pins_one_slf4j_binding_and_the_plugin() -> None:
    pom = POM.read_text()
    assert "<artifactId>log4j-slf4j2-impl</artifactId>" in pom
    assert "<artifactId>log4j-slf4j-impl</artifactId>" not in pom
    assert "<slf4j.version>2.0.17</slf4j.version>" in pom
    assert f"<kafka.version>{DEFAULT_VERSION}</kafka.version>" in pom
    assert "<version>3.8.1</version>" in pom
    assert LOG4J2_CONFIG.is_file()


# -- server.properties -----------------------------------------------------------------------
def test_properties_make_one_combined_kraft_node_with_a_static_quorum(tmp_path: Path) -> None:
    props = server_properties(9092, 9093, tmp_path / "data")
    assert props["process.roles"] == "broker,controller"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:9093"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093"
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:9092"
    assert props["log.dirs"] == str(tmp_path / "data")
    assert int(props["log.cleaner.dedupe.buffer.size"]) > 1024 * 1024  # Kafka's minimum, per thread
    assert props["auto.create.topics.enable"] == "true"


def test_extra_properties_add_to_and_override_ours(tmp_path: Path) -> None:
    props = server_properties(9092, 9093, tmp_path, {"listeners": "SASL_PLAINTEXT://127.0.0.1:1",
                                                    "sasl.enabled.mechanisms": "PLAIN"})
    assert props["listeners"] == "SASL_PLAINTEXT://127.0.0.1:1"
    assert props["sasl.enabled.mechanisms"] == "PLAIN"
    assert props["node.id"] == BASE_PROPERTIES["node.id"]


def test_properties_are_escaped_as_java_reads_them() -> None:
    text = render_properties({"a.b": "c", "odd key=:": " lead\\back\nline", "u": "é€😀",
                              "jaas": 'Plain required username="u";'})
    assert text.splitlines()[1:] == [
        "a.b=c",
        "odd\\ key\\=\\:=\\ lead\\\\back\\nline",
        "u=\\u00e9\\u20ac\\ud83d\\ude00",
        'jaas=Plain required username="u";',
    ]
    text.encode("latin-1")  # Kafka reads server.properties as ISO-8859-1


def test_the_jvm_command_runs_the_broker_from_the_jar_dir(tmp_path: Path) -> None:
    argv = jvm_command("java", tmp_path, "kafka.Kafka", "server.properties")
    assert argv[0] == "java"
    assert argv[-4:] == ["-cp", f"{tmp_path}/*", "kafka.Kafka", "server.properties"]
    assert {"-Xmx512m", "-XX:+UseSerialGC", FAST_START_FLAG} <= set(argv)
    assert f"-Dlog4j2.configurationFile={LOG4J2_CONFIG}" in argv
    assert FAST_START_FLAG not in jvm_command("java", tmp_path, "kafka.Kafka", fast_start=False)


# -- the Metadata probe ----------------------------------------------------------------------
def test_the_metadata_request_is_v4_for_no_topic() -> None:
    request = metadata_request(7, b"c")
    size, key, version, correlation, client_len = struct.unpack_from("!ihhih", request)
    assert (size, key, version, correlation, client_len) == (len(request) - 4, 3, 4, 7, 1)
    assert request[-5:] == struct.pack("!ib", 0, 0)


def _broker(node: int, host: bytes, port: int, rack: bytes | None) -> bytes:
    rack_bytes = struct.pack("!h", -1) if rack is None else struct.pack("!h", len(rack)) + rack
    return struct.pack("!ih", node, len(host)) + host + struct.pack("!i", port) + rack_bytes


def test_the_metadata_answer_lists_the_brokers() -> None:
    payload = (struct.pack("!iii", 7, 0, 2) + _broker(1, b"127.0.0.1", 9092, None)
               + _broker(2, b"h", 1, b"rack-a") + struct.pack("!hii", -1, 1, 0))
    assert parse_metadata_brokers(payload, 7) == [(1, "127.0.0.1", 9092), (2, "h", 1)]
    with pytest.raises(ValueError, match="correlation"):
        parse_metadata_brokers(payload, 8)


def test_a_broker_not_started_has_no_controller_port() -> None:
    broker = ApacheKafka(KAFKA_3_9)
    assert broker.name == f"Apache Kafka {KAFKA_3_9}"
    with pytest.raises(LocalServiceError, match="call start"):
        _ = broker.controller_port
    assert ApacheKafka(controller_port=9999).controller_port == 9999
