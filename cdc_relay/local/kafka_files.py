"""Apache Kafka's files for a throwaway broker: the jars, ``server.properties``, the storage.

Owns the broker's jars (resolved by Maven from Maven Central through the POM in
``kafka_jars/``, cached per version under ``~/.cache/cdc-relay/kafka/<version>/lib`` or
``$CDC_RELAY_KAFKA_CACHE/<version>/lib``), a storage directory formatted once per version
(copied for each broker), its ``server.properties`` (KRaft, one combined broker+controller
node with a static quorum) and the JVM command line. The broker process itself is
cdc_relay.local.apache_kafka's.

Must not: start a broker or keep a process running (Maven and the StorageTool run to
completion), import the relay's drivers, or reach any network but Maven Central (through
Maven).
"""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path

from cdc_relay.errors import LocalServiceError
from cdc_relay.local.cache import cache_dir, install, locked
from cdc_relay.local.helpers import HOST, clean_env

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
