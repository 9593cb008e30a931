"""``cdc-relay demo`` runs the whole pipeline on its own services and cleans up after itself.

The demo starts its own PostgreSQL cluster and broker (not the session fixtures), so
these tests check what a user sees: a short run in each mode ends by itself with exit 0
and nothing lost, and Ctrl-C (SIGINT) mid-run stops the relay, the broker and the
cluster the demo started.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from tests.support import cli_command, wait_for

pytestmark = pytest.mark.slow


def _processes_mentioning(text: str) -> list[int]:
    """Pids of live processes whose command line contains ``text``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text in cmdline and state != "Z":
            found.append(int(entry.name))
    return found


@pytest.mark.parametrize("mode", ["wal", "poll"])
def test_a_short_demo_ends_by_itself_with_nothing_lost(mode: str) -> None:
    done = subprocess.run(cli_command("demo", "--events", "200", "--rate", "100", "--mode", mode),
                          capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"^\s*lost\s+0$", done.stdout, re.MULTILINE), done.stdout
    assert re.search(r"^\s*events received\s+200$", done.stdout, re.MULTILINE), done.stdout
    assert "stopped everything the demo started" in done.stdout


def test_sigint_mid_run_stops_everything_the_demo_started(tmp_path: Path) -> None:
    out_path = tmp_path / "demo.out"
    with open(out_path, "wb") as out:
        proc = subprocess.Popen(cli_command("demo", "--events", "100000", "--rate", "100"),
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        wait_for(lambda: "received" in out_path.read_text(), timeout=120,
                 message="the demo streaming events")
        output = out_path.read_text()
        data_dir = re.search(r"data dir (\S+)\)", output)
        broker = re.search(r"broker \(Tansu, in memory\) at (127\.0\.0\.1:\d+)", output)
        relay = re.search(r"\(pid (\d+)\)", output)
        assert data_dir and broker and relay, output
        assert _processes_mentioning(data_dir.group(1)), "the demo's PostgreSQL is running"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 130, out_path.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    output = out_path.read_text()
    assert "stopped everything the demo started" in output
    assert _processes_mentioning(data_dir.group(1)) == [], "PostgreSQL survived the demo"
    assert _processes_mentioning(f"tcp://{broker.group(1)}") == [], "the broker survived the demo"
    with pytest.raises(ProcessLookupError):
        os.kill(int(relay.group(1)), 0)
    assert not Path(data_dir.group(1)).exists()
