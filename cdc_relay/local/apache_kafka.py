"""A throwaway single-node Apache Kafka broker (the real JVM one) for tests and benchmarks.

Owns the broker's jars (resolved by Maven from Maven Central through the POM in
``kafka_jars/``, cached per version under ``~/.cache/cdc-relay/kafka/<version>/lib`` or
``$CDC_RELAY_KAFKA_CACHE/<version>/lib``), a storage directory formatted once per version
and copied for each broker, its ``server.properties`` (KRaft, one combined
broker+controller node with a static quorum, both listeners on free 127.0.0.1 ports),
and how it is started, found ready (it lists itself in a Metadata answer), stopped and
restarted. The process handling every local broker shares (kill, pause/resume, cleanup)
is cdc_relay.local.kafka_process. Unlike Tansu (cdc_relay.local.broker) it has Kafka's own
semantics: transactions, ``read_committed``, idempotence, consumer groups, and topics kept
across ``restart()`` (docs/design.md, test services).

Fill the cache ahead of time (scripts/bootstrap.sh does) with
``python -m cdc_relay.local.apache_kafka fetch [VERSION...]``.

Must not: touch a process it did not start, import the relay's drivers (no confluent_kafka
here), or reach any network but Maven Central (through Maven).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Self

from cdc_relay.errors import LocalServiceError
from cdc_relay.local.cache import cache_dir, install, locked
from cdc_relay.local.helpers import HOST, clean_env, free_port, tail, wait_serving
from cdc_relay.local.kafka_process import KafkaProcess

KAFKA_4_1 = "4.1.2"
KAFKA_3_9 = "3.9.2"
PINNED_VERSIONS = (KAFKA_4_1, KAFKA_3_9)
DEFAULT_VERSION = KAFKA_4_1
CACHE_ENV = "CDC_RELAY_KAFKA_CACHE"
NODE_ID = 1
# A fixed cluster id (base64 of a UUID): every broker starts from one formatted template.
CLUSTER_ID = "WpxSl4H2Wty001NN0aXUeg"
DATA_DIR = Path(__file__).with_name("kafka_jars")
POM = DATA_DIR / "pom.xml"
LOG4J2_CONFIG = DATA_DIR / "log4j2.properties"
JVM_FLAGS = ("-Xms64m", "-Xmx512m", "-XX:+UseSerialGC", "-Djava.awt.headless=true")
FAST_START_FLAG = "-XX:TieredStopAtLevel=1"
MAVEN_TIMEOUT = 900.0
# What a broker of ours needs beyond Kafka's defaults: one node, small buffers, no delays.
BASE_PROPERTIES: Mapping[str, str] = {
    "process.roles": "broker,controller",
    "node.id": str(NODE_ID),
    "controller.listener.names": "CONTROLLER",
    "inter.broker.listener.name": "PLAINTEXT",
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "1",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "1",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "group.initial.rebalance.delay.ms": "0",
    "group.min.session.timeout.ms": "1000",
    "log.cleaner.dedupe.buffer.size": str(2 * 1024 * 1024),  # must be > 1 MiB per cleaner thread
    # A SIGKILLed broker's registration lives until its session expires (Kafka's default
    # 9 s): the next start waits for that before the controller takes it back.
    "broker.session.timeout.ms": "3000",
    "broker.heartbeat.interval.ms": "500",
    "num.partitions": "1",
    "auto.create.topics.enable": "true",
}
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_METADATA_KEY, _METADATA_VERSION = 3, 4  # Kafka 4 answers Metadata v4 and later only


# -- the jar cache ---------------------------------------------------------------------------
def cache_root(env: Mapping[str, str] = os.environ) -> Path:
    """Where the per-version jars and storage templates live: ``$CDC_RELAY_KAFKA_CACHE``,
    else ``~/.cache/cdc-relay/kafka``."""
    return cache_dir("kafka", CACHE_ENV, env)


def jar_dir(version: str, root: Path) -> Path:
    """The directory holding ``version``'s jars under the cache ``root``."""
    return root / version / "lib"


def has_jars(lib: Path, version: str) -> bool:
    """Whether ``lib`` holds a complete copy: the broker of ``version`` and its Log4j2 binding."""
    bindings = ("log4j-core-*.jar", "log4j-slf4j2-impl-*.jar", "slf4j-api-*.jar")
    return (lib / f"kafka_2.13-{version}.jar").is_file() and all(any(lib.glob(p)) for p in bindings)


def maven_command(mvn: str, version: str, output: Path, pom: Path = POM) -> list[str]:
    """The Maven run that copies ``version``'s broker jars (and nothing else) into ``output``."""
    return [mvn, "-B", "-q", "-Dstyle.color=never", "-f", str(pom), f"-Dkafka.version={version}",
            "dependency:copy-dependencies", f"-DoutputDirectory={output}"]


def maven_failure(version: str, returncode: int, output: str) -> str:
    """One line saying why Maven could not fetch ``version``: its first ``[ERROR]`` line."""
    lines = [_ANSI.sub("", line).strip() for line in output.splitlines()]
    errors = [line for line in lines if line.startswith("[ERROR]") and len(line) > len("[ERROR]")]
    reason = (errors or [line for line in lines if line] or ["no output"])[0]
    return f"Maven could not fetch Apache Kafka {version}'s jars (exit {returncode}): {reason}"


def require_tool(name: str, hint: str) -> str:
    """The path of ``name`` on PATH, or LocalServiceError saying how to install it."""
    found = shutil.which(name)
    if found is None:
        raise LocalServiceError(f"{name} is not on PATH: {hint}")
    return found


def java_binary() -> str:
    """The ``java`` that runs the broker (Java 17 or later)."""
    return require_tool("java", "Apache Kafka needs Java 17+ (apt-get install openjdk-17-jre-headless)")


def ensure_jars(version: str = DEFAULT_VERSION, root: Path | None = None) -> Path:
    """The directory of ``version``'s jars, fetched by Maven into the cache if missing."""
    root = cache_root() if root is None else root
    lib = jar_dir(version, root)
    if has_jars(lib, version):
        return lib
    mvn = require_tool("mvn", "fetching Apache Kafka's jars needs Maven (apt-get install maven)")
    java_binary()
    with locked(root / version):
        if not has_jars(lib, version):
            install(_fetch(mvn, version, root / version), lib)
    return lib


def _fetch(mvn: str, version: str, parent: Path) -> Path:
    """Run Maven into a fresh directory under ``parent``; return it once complete."""
    built = Path(tempfile.mkdtemp(prefix=".lib-", dir=parent))
    built.chmod(0o755)  # mkdtemp's 0700 would hide a shared cache from other users
    try:
        try:
            run = subprocess.run(maven_command(mvn, version, built), cwd=built, capture_output=True,
                                 text=True, check=False, timeout=MAVEN_TIMEOUT, env=clean_env())
        except subprocess.TimeoutExpired:
            raise LocalServiceError(f"Maven did not fetch Apache Kafka {version}'s jars "
                                    f"in {MAVEN_TIMEOUT:.0f} s") from None
        if run.returncode != 0 or not has_jars(built, version):
            raise LocalServiceError(maven_failure(version, run.returncode, run.stdout + run.stderr))
    except BaseException:
        shutil.rmtree(built, ignore_errors=True)
        raise
    return built


# -- server.properties -----------------------------------------------------------------------
def server_properties(port: int, controller_port: int, log_dir: Path,
                      extra: Mapping[str, str] | None = None,
                      listeners: Mapping[str, int] | None = None) -> dict[str, str]:
    """The broker's properties: Kafka's defaults, ours (BASE_PROPERTIES), the listeners, then
    ``extra`` (which may override any of them: SASL, TLS, ACLs). ``listeners`` adds client
    listeners beside PLAINTEXT, by name (e.g. ``{"SASL_SSL": 9094}``: cdc_relay.local.kafka_security)."""
    more = "".join(f",{name}://{HOST}:{number}" for name, number in (listeners or {}).items())
    return {
        **BASE_PROPERTIES,
        "controller.quorum.voters": f"{NODE_ID}@{HOST}:{controller_port}",
        "listeners": f"PLAINTEXT://{HOST}:{port}{more},CONTROLLER://{HOST}:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://{HOST}:{port}{more}",
        "log.dirs": str(log_dir),
        **(extra or {}),
    }


def _escape(text: str, *, key: bool) -> str:
    """``text`` as java.util.Properties reads it back (ISO-8859-1 file, backslash escapes)."""
    out = []
    for index, char in enumerate(text):
        if char == "\\":
            out.append("\\\\")
        elif char in "\n\r\t\f":
            out.append({"\n": "\\n", "\r": "\\r", "\t": "\\t", "\f": "\\f"}[char])
        elif not " " <= char <= "~":
            out.extend(f"\\u{unit:04x}" for unit in struct.unpack(
                f">{len(char.encode('utf-16-be')) // 2}H", char.encode("utf-16-be")))
        elif (key and char in " =:#!") or (char == " " and index == 0):
            out.append("\\" + char)
        else:
            out.append(char)
    return "".join(out)


def render_properties(properties: Mapping[str, str]) -> str:
    """A ``server.properties`` file holding exactly ``properties``."""
    lines = [f"{_escape(key, key=True)}={_escape(value, key=False)}" for key, value in properties.items()]
    return "# cdc_relay.local.apache_kafka\n" + "\n".join(lines) + "\n"


def jvm_command(java: str, lib: Path, main: str, *args: str, fast_start: bool = True) -> list[str]:
    """The JVM argv running class ``main`` from the jars in ``lib`` with ``args``;
    ``fast_start`` stops the JIT at C1 (starts sooner, runs slower: not for benchmarks)."""
    flags = [*JVM_FLAGS, *([FAST_START_FLAG] if fast_start else []),
             f"-Dlog4j2.configurationFile={LOG4J2_CONFIG}"]
    return [java, *flags, "-cp", f"{lib}/*", main, *args]


# -- the storage template --------------------------------------------------------------------
def ensure_formatted(version: str, lib: Path, root: Path | None = None) -> Path:
    """A storage directory formatted for ``version`` (CLUSTER_ID, node NODE_ID), made once.

    Formatting with a static quorum records no address, so one template serves every
    broker of that version whatever its ports.
    """
    root = cache_root() if root is None else root
    template = root / version / "formatted"
    if (template / "meta.properties").is_file():
        return template
    with locked(root / version):
        if not (template / "meta.properties").is_file():
            install(_format(lib, root / version), template)
    return template


def _format(lib: Path, parent: Path) -> Path:
    """Run Kafka's StorageTool into a fresh directory under ``parent``; return the storage."""
    work = Path(tempfile.mkdtemp(prefix=".format-", dir=parent))
    try:
        storage = work / "data"
        config = work / "server.properties"
        config.write_text(render_properties(server_properties(9092, 9093, storage)), encoding="latin-1")
        argv = jvm_command(java_binary(), lib, "kafka.tools.StorageTool", "format", "-t", CLUSTER_ID,
                           "-c", str(config))
        run = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120,
                             env=clean_env())
        if run.returncode != 0:
            raise LocalServiceError(f"Kafka's StorageTool failed (exit {run.returncode}): "
                                    f"{(run.stdout + run.stderr).strip()[-500:]}")
        return storage.rename(parent / f".formatted-{work.name}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


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
