"""Processes the harness starts: spawned helpers and the relay under test.

``spawn`` starts a harness function in a fresh interpreter (the ``spawn`` start method:
no fork of a process that holds librdkafka or libpq threads). ``RelayProcess`` runs the
real ``cdc-relay`` CLI as a subprocess with its output in a log file, and reads its CPU
time and peak RSS from /proc while it still runs. Everything started here is stopped by
its owner in a ``finally``; ``stop`` escalates SIGTERM → SIGKILL by pid only.

``byte_compile`` makes the code under test start as an installed one does: pip
byte-compiles a package when it installs it, but an editable install's source tree has no
``.pyc`` where ``PYTHONDONTWRITEBYTECODE`` is set (as on this project's machines), and
every relay spawned from it would compile its modules again (~25 ms of start-up here).

Must not: know what a mode measures (runner.py does).
"""

from __future__ import annotations

import compileall
import multiprocessing
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from multiprocessing.process import BaseProcess
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

from benchmarks.procstat import cpu_seconds, peak_rss_mb

CTX = multiprocessing.get_context("spawn")


def byte_compile(*packages: Path) -> None:
    """Write the ``.pyc`` files of ``packages`` (as pip does at install; see the docstring).

    compileall writes them whatever ``PYTHONDONTWRITEBYTECODE`` says; Python still checks
    each against its source, so an edit later is never run stale.
    """
    for package in packages:
        if not compileall.compile_dir(package, quiet=1):
            raise RuntimeError(f"cannot byte-compile {package}")


def code_under_test() -> tuple[Path, Path]:
    """The cdc_relay package and the harness itself (the classic baseline runs from it)."""
    import cdc_relay

    return Path(cdc_relay.__file__).parent, Path(__file__).parent


def spawn(target: Callable[..., None], *args: Any) -> BaseProcess:
    """Start ``target(*args)`` in a spawned, daemonic child process."""
    proc = CTX.Process(target=target, args=args, daemon=True)
    proc.start()
    return proc


def wait_event(event: Event, proc: BaseProcess, what: str, timeout: float = 60.0) -> None:
    """Wait until ``event`` is set; RuntimeError if ``proc`` died or time ran out."""
    deadline = time.monotonic() + timeout
    while not event.wait(0.05):
        if not proc.is_alive():
            raise RuntimeError(f"{what} exited (code {proc.exitcode}) before it was ready")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} not ready within {timeout:.0f} s")


def finish(proc: BaseProcess, timeout: float = 30.0) -> None:
    """Join ``proc``; terminate (then kill) it if it does not end in time."""
    proc.join(timeout)
    if proc.is_alive():
        proc.terminate()
        proc.join(5)
    if proc.is_alive():
        proc.kill()
        proc.join(5)


def cli(*args: str, module: str = "cdc_relay") -> list[str]:
    """argv running ``cdc-relay args…`` (or another ``python -m`` module) with this interpreter."""
    return [sys.executable, "-m", module, *args]


def run_cli(args: Sequence[str], log: Path, timeout: float = 120.0) -> None:
    """Run a short ``cdc-relay`` command to completion; RuntimeError with its log if it fails."""
    with open(log, "ab") as out:
        done = subprocess.run(cli(*args), stdout=out, stderr=subprocess.STDOUT, timeout=timeout,
                              stdin=subprocess.DEVNULL, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"cdc-relay {args[0]} failed (exit {done.returncode}): "
                           f"{log.read_text(errors='replace')[-2000:]}")


class RelayProcess:
    """The relay under test: ``cdc-relay run|poll …`` as a subprocess, logging to a file."""

    def __init__(self, args: Sequence[str], log: Path, module: str = "cdc_relay", *,
                 wrapper: Sequence[str] = ()) -> None:
        """``wrapper``: a command the relay runs under (valgrind: instructions.py)."""
        self.log = log
        self.started = time.time()
        with open(log, "ab") as out:
            self.proc = subprocess.Popen([*wrapper, *cli(*args, module=module)], stdout=out,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def check_alive(self) -> None:
        """RuntimeError with the log's tail if the relay has exited."""
        code = self.proc.poll()
        if code is not None:
            raise RuntimeError(f"the relay exited early (code {code}): "
                               f"{self.log.read_text(errors='replace')[-2000:]}")

    def usage(self) -> tuple[float, float]:
        """(CPU seconds so far, peak RSS MiB so far), read while it runs."""
        self.check_alive()
        return cpu_seconds(self.pid), peak_rss_mb(self.pid)

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM (a clean stop: flush, confirm), SIGKILL after ``timeout``; the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(15)
        return self.proc.returncode
