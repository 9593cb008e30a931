"""A throwaway Apicurio Registry (the real JVM one, in-memory storage) for tests and benchmarks.

Owns the registry's distribution (``io.apicurio:apicurio-registry-app:<version>:tar.gz:all``,
downloaded from Maven Central and checked against its SHA-1, unpacked once per version under
``~/.cache/cdc-relay/apicurio/<version>/app`` or ``$CDC_RELAY_APICURIO_CACHE/<version>/app``),
how it is started on a free 127.0.0.1 port (``java -jar`` the Quarkus runner, in-memory
storage: Apicurio's default), found ready (it answers the Confluent-compatible API's
``GET /apis/ccompat/v7/subjects`` itself), stopped and restarted (in-memory: a restart
forgets every schema). The process handling (temp dir, kill, pause/resume, cleanup) is
cdc_relay.local.kafka_process's, which every local JVM/broker process shares.

Why 3.0.x: the 3.1+ distributions are compiled for Java 21, and the machines run Java 17
(docs/development.md, test services).

Fill the cache ahead of time (scripts/bootstrap.sh does) with
``python -m cdc_relay.local.apicurio fetch [VERSION...]``.

Must not: touch a process it did not start, import the relay's drivers (no confluent_kafka
here), or reach any network but Maven Central.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Self

from cdc_relay.errors import LocalServiceError
from cdc_relay.local.apache_kafka import java_binary
from cdc_relay.local.cache import cache_dir, install, locked
from cdc_relay.local.helpers import clean_env, tail, wait_serving
from cdc_relay.local.kafka_process import KafkaProcess

DEFAULT_VERSION = "3.0.9"
CACHE_ENV = "CDC_RELAY_APICURIO_CACHE"
CCOMPAT_PATH = "/apis/ccompat/v7"
JVM_FLAGS = ("-Xms32m", "-Xmx384m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
             "-Djava.awt.headless=true")
CENTRAL = "https://repo1.maven.org/maven2"
DOWNLOAD_TIMEOUT = 600.0


# -- the distribution cache --------------------------------------------------------------------
def cache_root(env: Mapping[str, str] | None = None) -> Path:
    """``$CDC_RELAY_APICURIO_CACHE``, else ``~/.cache/cdc-relay/apicurio``."""
    return cache_dir("apicurio", CACHE_ENV, env)


def runner_jar(app: Path) -> Path | None:
    """The jar ``java -jar`` runs in an unpacked distribution: 3.1+'s ``quarkus-run.jar``
    (fast-jar layout), 3.0's ``apicurio-registry-app-<version>-runner.jar``; None if absent."""
    fast = app / "quarkus-run.jar"
    if fast.is_file():
        return fast
    return next(iter(sorted(app.glob("apicurio-registry-app-*-runner.jar"))), None)


def tarball_url(version: str, base: str = CENTRAL) -> str:
    """Where Maven Central keeps ``version``'s distribution (``...:tar.gz:all``)."""
    name = f"apicurio-registry-app-{version}-all.tar.gz"
    return f"{base}/io/apicurio/apicurio-registry-app/{version}/{name}"


def ensure_app(version: str = DEFAULT_VERSION, root: Path | None = None) -> Path:
    """The unpacked distribution of ``version``, fetched and unpacked into the cache if missing."""
    root = cache_root() if root is None else root
    app = root / version / "app"
    if runner_jar(app) is not None:
        return app
    java_binary()
    with locked(root / version):
        if runner_jar(app) is None:
            install(_fetch(version, root / version), app)
    return app


def _download(url: str, target: Path) -> None:
    """``url`` into ``target``, checked against Maven Central's ``.sha1`` beside it."""
    try:
        with urllib.request.urlopen(url + ".sha1", timeout=60) as answer:
            expected = answer.read().decode().split()[0].strip().lower()
        digest = hashlib.sha1(usedforsecurity=False)
        with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT) as answer, open(target, "wb") as out:
            while chunk := answer.read(1 << 20):
                digest.update(chunk)
                out.write(chunk)
    except (OSError, urllib.error.URLError) as exc:
        raise LocalServiceError(f"could not download {url}: {exc} (Maven Central must be "
                                "reachable; or fill the cache on a machine where it is)") from exc
    if digest.hexdigest() != expected:
        raise LocalServiceError(f"{url}: SHA-1 {digest.hexdigest()} is not Maven Central's "
                                f"{expected}; try again")


def _fetch(version: str, parent: Path) -> Path:
    """Download and unpack into a fresh directory under ``parent``; return it once complete.

    Not through Maven: 3.0.x's parent POM (io.apicurio:apicurio-registry) is not on Maven
    Central, so Maven cannot resolve the artifact; the tarball itself is, with its SHA-1.
    """
    work = Path(tempfile.mkdtemp(prefix=".fetch-", dir=parent))
    try:
        tarball = work / "app.tar.gz"
        _download(tarball_url(version), tarball)
        built = work / "app"
        with tarfile.open(tarball) as archive:
            archive.extractall(built, filter="data")
        if runner_jar(built) is None:
            raise LocalServiceError(f"Apicurio Registry {version}'s distribution has no runner jar "
                                    "(quarkus-run.jar or *-runner.jar)")
        built.chmod(0o755)
        return built.rename(parent / f".app-{work.name}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


# -- readiness ---------------------------------------------------------------------------------
def answers_ccompat(url: str, timeout: float = 1.0) -> bool:
    """Whether ``url`` (the registry's base URL) answers ``GET /apis/ccompat/v7/subjects``."""
    try:
        with urllib.request.urlopen(url + CCOMPAT_PATH + "/subjects", timeout=timeout) as answer:
            return bool(answer.status == 200)
    except (OSError, urllib.error.URLError, ValueError):
        return False


# -- the registry ------------------------------------------------------------------------------
class ApicurioRegistry(KafkaProcess):
    """One Apicurio Registry on 127.0.0.1 with in-memory storage; ``url`` is its base URL,
    ``ccompat_url`` the Confluent-compatible API (what confluent-kafka's client is given).

    ``properties`` are passed as ``-Dkey=value`` (Quarkus/Apicurio settings); ``cache`` is
    the distribution cache root (default ``cache_root()``).
    """

    log_name = "apicurio.log"
    tmp_prefix = "cdc-relay-apicurio-"

    def __init__(self, version: str = DEFAULT_VERSION, *, port: int | None = None,
                 properties: Mapping[str, str] | None = None, cache: Path | None = None) -> None:
        super().__init__(port=port)
        self.version = version
        self.name = f"Apicurio Registry {version}"
        self._properties = dict(properties or {})
        self._cache = cache
        self._app: Path | None = None

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``: the registry's base URL."""
        return f"http://{self.host}:{self.port}"

    @property
    def ccompat_url(self) -> str:
        """The Confluent-compatible API's URL: ``url.schema_registry_url`` for clients."""
        return self.url + CCOMPAT_PATH

    def start(self, timeout: float = 90.0) -> Self:
        """Start the registry (fetching it first if the cache lacks it) and wait until it
        answers the Confluent-compatible API itself (~4 s here)."""
        return super().start(timeout)

    def _command(self, tmp: Path, port: int) -> tuple[list[str], dict[str, str]]:
        if self._app is None:
            raise LocalServiceError(f"{self.name} is not unpacked yet")
        jar = runner_jar(self._app)
        settings = {"quarkus.http.port": str(port), "quarkus.http.host": self.host,
                    "quarkus.http.access-log.enabled": "false", **self._properties}
        flags = [f"-D{key}={value}" for key, value in settings.items()]
        return [java_binary(), *JVM_FLAGS, *flags, "-jar", str(jar)], clean_env()

    def _spawn(self, tmp: Path, port: int, timeout: float) -> bool:
        if self._app is None:
            self._app = ensure_app(self.version, cache_root() if self._cache is None else self._cache)
        argv, env = self._command(tmp, port)
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                          stderr=subprocess.STDOUT, cwd=tmp,
                                          start_new_session=True, env=env)
        try:
            if wait_serving(self._proc, port, lambda: answers_ccompat(self.url), timeout):
                return True
        except TimeoutError:
            self.kill()
            raise LocalServiceError(f"{self.name} did not start on {self.url}; "
                                    f"{self.log_path}:\n{tail(self.log_path)}") from None
        self.kill()
        return False

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM (Quarkus shuts down in well under a second), then SIGKILL after ``timeout`` s."""
        self._stop_with(signal.SIGTERM, timeout)

    def restart(self, timeout: float = 90.0) -> None:
        """Stop and start again on the same port. In-memory storage: every schema is gone,
        and ids start over (a serializer registers its schema again)."""
        self.stop()
        self.start(timeout)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m cdc_relay.local.apicurio fetch [VERSION...]``: fill the cache."""
    parser = argparse.ArgumentParser(prog="python -m cdc_relay.local.apicurio")
    commands = parser.add_subparsers(dest="command", required=True)
    fetch = commands.add_parser("fetch", help="fetch Apicurio Registry into the cache")
    fetch.add_argument("versions", nargs="*", metavar="VERSION", default=[DEFAULT_VERSION])
    args = parser.parse_args(argv)
    try:
        for version in args.versions:
            print(f"Apicurio Registry {version}: {ensure_app(version)}")
    except LocalServiceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
