"""The cache of downloaded and built things the local services run from (~/.cache/cdc-relay).

Owns where each kind of thing is kept (a subdirectory, movable by an environment variable),
the lock that lets parallel test workers fill an entry once, and the rename that puts a
complete entry in place, so no reader ever sees a half-written one. Apache Kafka's jars
(local/apache_kafka.py), Apicurio Registry's distribution (local/apicurio.py) and the tests'
Java consumer use it.

Must not: download or build anything itself, or start a process.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path


def cache_dir(name: str, env_var: str, env: Mapping[str, str] | None = None) -> Path:
    """``$env_var`` when set, else ``~/.cache/cdc-relay/<name>``."""
    configured = (os.environ if env is None else env).get(env_var, "")
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "cdc-relay" / name


@contextlib.contextmanager
def locked(directory: Path) -> Iterator[None]:
    """Hold ``directory/.lock`` exclusively (parallel test workers fill the cache once)."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def install(built: Path, target: Path) -> None:
    """Move the complete directory ``built`` to ``target`` (a leftover there is replaced)."""
    if target.exists():
        shutil.rmtree(target)
    built.rename(target)
