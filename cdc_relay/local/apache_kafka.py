"""A throwaway single-node Apache Kafka broker (the real JVM one) for tests and benchmarks.

Owns how the broker is started (both listeners on free 127.0.0.1 ports), found ready (it
lists itself in a Metadata answer), stopped and restarted, and the ``fetch`` command. Its
files - the jars, ``server.properties``, the formatted storage - are
cdc_relay.local.kafka_files'. The process handling every local broker shares (kill,
pause/resume, cleanup) is cdc_relay.local.kafka_process. Unlike Tansu
(cdc_relay.local.broker) it has Kafka's own semantics: transactions, ``read_committed``,
idempotence, consumer groups, and topics kept across ``restart()`` (docs/design.md, test
services).

Fill the cache ahead of time (scripts/bootstrap.sh does) with
``python -m cdc_relay.local.apache_kafka fetch [VERSION...]``.

Must not: touch a process it did not start, import the relay's drivers (no confluent_kafka
here), or reach any network but Maven Central (through Maven).
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Self

from cdc_relay.errors import LocalServiceError
from cdc_relay.local.helpers import clean_env, free_port, tail, wait_serving

# Each ``X as X`` import is a re-export: tests, benchmarks and other local services import it here.
from cdc_relay.local.kafka_files import DEFAULT_VERSION as DEFAULT_VERSION
from cdc_relay.local.kafka_files import FAST_START_FLAG as FAST_START_FLAG
from cdc_relay.local.kafka_files import KAFKA_3_9 as KAFKA_3_9
from cdc_relay.local.kafka_files import KAFKA_4_1 as KAFKA_4_1
from cdc_relay.local.kafka_files import (
    NODE_ID,
    PINNED_VERSIONS,
    ensure_formatted,
    ensure_jars,
    render_properties,
    server_properties,
)
from cdc_relay.local.kafka_files import cache_root as cache_root
from cdc_relay.local.kafka_files import has_jars as has_jars
from cdc_relay.local.kafka_files import jar_dir as jar_dir
from cdc_relay.local.kafka_files import java_binary as java_binary
from cdc_relay.local.kafka_files import jvm_command as jvm_command
from cdc_relay.local.kafka_files import require_tool as require_tool
from cdc_relay.local.kafka_process import KafkaProcess

_METADATA_KEY, _METADATA_VERSION = 3, 4  # Kafka 4 answers Metadata v4 and later only


# -- readiness: the broker lists itself in a Metadata answer ------------------------------------
def metadata_request(correlation: int, client: bytes = b"cdc-relay-local") -> bytes:
    """A size-prefixed Metadata v4 request for no topic (just the brokers)."""
    body = struct.pack("!hhih", _METADATA_KEY, _METADATA_VERSION, correlation, len(client)) + client
    body += struct.pack("!ib", 0, 0)  # topics: []; allow_auto_topic_creation: false
    return struct.pack("!i", len(body)) + body


def parse_metadata_brokers(payload: bytes, correlation: int) -> list[tuple[int, str, int]]:
    """The (node id, host, port) of each broker in a Metadata v4 response (without its size)."""
    answered, _throttle, count = struct.unpack_from("!iii", payload)
    if answered != correlation:
        raise ValueError(f"correlation id {answered}, expected {correlation}")
    offset, brokers = 12, []
    for _ in range(count):
        node, length = struct.unpack_from("!ih", payload, offset)
        host = payload[offset + 6:offset + 6 + length].decode()
        port, rack = struct.unpack_from("!ih", payload, offset + 6 + length)
        offset += 6 + length + 6 + max(rack, 0)
        brokers.append((node, host, port))
    return brokers


def kafka_brokers(host: str, port: int, timeout: float = 1.0) -> list[tuple[int, str, int]]:
    """The brokers ``host:port`` lists in a Metadata answer; empty if it does not answer."""
    correlation = 0x0C0FFEE
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(metadata_request(correlation))
            with sock.makefile("rb") as stream:
                size = struct.unpack("!i", stream.read(4))[0]
                return parse_metadata_brokers(stream.read(size), correlation)
    except (OSError, struct.error, ValueError, UnicodeDecodeError):
        return []


def listening(host: str, port: int) -> bool:
    """Whether something accepts TCP connections on ``host:port``."""
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=1.0):
        return True
    return False


# -- the broker ------------------------------------------------------------------------------
class ApacheKafka(KafkaProcess):
    """A single-node KRaft Apache Kafka on 127.0.0.1, its data in a temp dir of its own.

    ``extra`` server properties are added to (or override) ours; ``listeners`` adds client
    listeners by name and port (the PLAINTEXT one on ``port`` stays: readiness, inter-broker);
    ``fast_start=False`` runs the JVM's full JIT (benchmarks). ``cache`` is the jar cache
    root (default ``cache_root()``).
    """

    log_name = "kafka.log"
    tmp_prefix = "cdc-relay-kafka-"

    def __init__(self, version: str = DEFAULT_VERSION, *, port: int | None = None,
                 controller_port: int | None = None, extra: Mapping[str, str] | None = None,
                 listeners: Mapping[str, int] | None = None, fast_start: bool = True,
                 cache: Path | None = None) -> None:
        super().__init__(port=port)
        self.version = version
        self.name = f"Apache Kafka {version}"
        self._controller_port = controller_port
        self._controller_picked = controller_port is None
        self._extra = dict(extra or {})
        self.listeners = dict(listeners or {})
        self._fast_start = fast_start
        self._cache = cache
        self._lib: Path | None = None

    @property
    def controller_port(self) -> int:
        """The KRaft controller listener's port (not for clients)."""
        if self._controller_port is None:
            raise LocalServiceError(f"{self.name} has no controller port yet: call start()")
        return self._controller_port

    @property
    def data_dir(self) -> Path:
        """The broker's ``log.dirs`` (kept by ``restart()``)."""
        return self.log_path.parent / "data"

    def start(self, timeout: float = 60.0) -> Self:
        """Start the broker (fetching its jars first if the cache lacks them) and wait until
        it serves: it answers ApiVersions and lists itself in a Metadata answer."""
        return super().start(timeout)

    def _command(self, tmp: Path, port: int) -> tuple[list[str], dict[str, str]]:
        if self._lib is None:
            raise LocalServiceError(f"{self.name} has no jars yet")
        config = tmp / "server.properties"
        properties = server_properties(port, self.controller_port, tmp / "data", self._extra,
                                       self.listeners)
        config.write_text(render_properties(properties), encoding="latin-1")
        argv = jvm_command(java_binary(), self._lib, "kafka.Kafka", str(config), fast_start=self._fast_start)
        return argv, clean_env()

    def _spawn(self, tmp: Path, port: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        self._prepare(tmp)
        for _ in range(5):
            self._pick_controller_port(port)
            served = self._run(tmp, port, deadline)
            if served is not None:
                return served
            self._controller_port = None  # another process took it: pick again
        raise LocalServiceError(f"{self.name} found no free controller port; {self.log_path}")

    def _run(self, tmp: Path, port: int, deadline: float) -> bool | None:
        """Run the broker until it serves on ``port``: True once it lists itself in a
        Metadata answer there; False if another process holds ``port``; None if another
        process took the controller port picked here; raising if it failed otherwise."""
        argv, env = self._command(tmp, port)
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                          stderr=subprocess.STDOUT, cwd=tmp,
                                          start_new_session=True, env=env)
        try:
            if wait_serving(self._proc, port, lambda: self._listed(port),
                            max(deadline - time.monotonic(), 0.1)):
                return True
        except TimeoutError:
            self.kill()
            if self._controller_picked and listening(self.host, self.controller_port):
                return None
            raise LocalServiceError(f"{self.name} did not start on {self.bootstrap}; "
                                    f"{self.log_path}:\n{tail(self.log_path)}") from None
        self.kill()
        return False

    def _listed(self, port: int) -> bool:
        """Whether the broker on ``port`` lists itself in a Metadata answer: it has joined
        its quorum and been unfenced (an ApiVersions answer can come before that)."""
        return (NODE_ID, self.host, port) in kafka_brokers(self.host, port, timeout=0.5)

    def _prepare(self, tmp: Path) -> None:
        """Fetch the jars if needed, and give a new broker a formatted storage directory."""
        root = cache_root() if self._cache is None else self._cache
        self._lib = ensure_jars(self.version, root)
        if not (tmp / "data").exists():
            shutil.copytree(ensure_formatted(self.version, self._lib, root), tmp / "data")

    def _pick_controller_port(self, port: int) -> None:
        while self._controller_port is None or self._controller_port == port:
            self._controller_port = free_port()

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM (a controlled shutdown, ~1-2 s), then SIGKILL after ``timeout`` s."""
        self._stop_with(signal.SIGTERM, timeout)

    def restart(self, timeout: float = 60.0) -> None:
        """Stop cleanly and start again on the same ports and data dir (topics survive)."""
        self.stop()
        self.start(timeout)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m cdc_relay.local.apache_kafka fetch [VERSION...]``: fill the cache (jars
    and storage template) for each version, by default every pinned one."""
    parser = argparse.ArgumentParser(prog="python -m cdc_relay.local.apache_kafka")
    commands = parser.add_subparsers(dest="command", required=True)
    fetch = commands.add_parser("fetch", help="fetch Apache Kafka's jars into the cache")
    fetch.add_argument("versions", nargs="*", metavar="VERSION", default=list(PINNED_VERSIONS))
    args = parser.parse_args(argv)
    try:
        for version in args.versions:
            lib = ensure_jars(version)
            ensure_formatted(version, lib)
            print(f"Apache Kafka {version}: {lib}")
    except LocalServiceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
