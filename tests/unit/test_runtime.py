"""The long-running commands tune the garbage collector; importing cdc_relay does not."""

from __future__ import annotations

import gc
import subprocess
import sys
from collections.abc import Iterator

import pytest

from cdc_relay.cli.main import cli
from cdc_relay.cli.options import run_cli
from cdc_relay.errors import ExitCode
from cdc_relay.runtime import GC_THRESHOLDS, tune_gc

CLOSED = "host=127.0.0.1 port=1 dbname=x user=u connect_timeout=2"


@pytest.fixture
def default_gc() -> Iterator[None]:
    saved = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    try:
        yield
    finally:
        gc.set_threshold(*saved)


def test_tune_gc_raises_the_thresholds_and_keeps_the_collector_on(default_gc: None) -> None:
    tune_gc()
    assert gc.get_threshold() == GC_THRESHOLDS
    assert gc.isenabled()


@pytest.mark.parametrize("command", ["run", "poll"])
def test_run_and_poll_tune_the_collector_before_anything_else(
        default_gc: None, capsys: pytest.CaptureFixture[str], command: str) -> None:
    # A malformed --producer-config is refused before any connection: by then the
    # command has tuned the collector.
    code = run_cli(cli, [command, "--dsn", CLOSED, "--brokers", "127.0.0.1:1",
                         "--producer-config", "no-equals-sign"])
    assert code == ExitCode.USAGE, capsys.readouterr().err
    assert gc.get_threshold() == GC_THRESHOLDS


def test_importing_the_package_and_its_cli_leaves_the_collector_alone() -> None:
    code = ("import gc; before = gc.get_threshold(); import cdc_relay.cli.main, "
            "cdc_relay.app.run, cdc_relay.app.poll; print(gc.get_threshold() == before)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "True"


def test_the_entry_point_tunes_the_collector_before_it_imports_the_cli() -> None:
    # A fresh interpreter: importing cli/entry.py changes nothing; calling it sets the
    # thresholds before click (the first heavy import) is imported.
    code = """
import gc, sys
gc.set_threshold(700, 10, 10)
import cdc_relay.cli.entry as entry
assert gc.get_threshold() == (700, 10, 10) and "click" not in sys.modules, "import changed it"

class Watch:
    seen = None
    def find_spec(self, name, path=None, target=None):
        if name == "click" and Watch.seen is None:
            Watch.seen = gc.get_threshold()
        return None

sys.meta_path.insert(0, Watch())
sys.argv = ["cdc-relay", "--version"]
try:
    entry.main()
except SystemExit as exc:
    assert exc.code in (0, None), exc.code
print(Watch.seen)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip().splitlines()[-1] == str(GC_THRESHOLDS)


def test_python_dash_m_runs_the_cli_through_the_entry_point() -> None:
    done = subprocess.run([sys.executable, "-m", "cdc_relay", "--version"], capture_output=True,
                          text=True, check=True)
    assert done.stdout.startswith("cdc-relay, version ")
