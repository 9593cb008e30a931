"""The benchmark harness runs end to end on a tiny workload and writes well-formed output.

No figure is asserted (benchmarks are not tests): only that ``python -m benchmarks run``
exits 0 and that results.json has the documented shape, report.md its sections, and the
plots exist; and that ``python -m benchmarks instructions`` counts a relay under
callgrind. The harness starts its own PostgreSQL cluster and brokers: Apache Kafka 4.1,
the benchmarks' default (``--broker kafka``), a fresh one per measurement.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MODES = ["wal-wal2json", "poll-notify", "poll-classic", "capture-pgoutput"]
LATENCY_MODES = MODES[:3]  # table CDC measures backlog throughput only

# One xdist worker runs both (make test: --dist loadgroup): each keeps a core busy for
# minutes, and side by side they ran past their timeouts on the shared 2-core machine.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("benchmarks")]


def _is_float(value: object) -> bool:
    return isinstance(value, float)


def test_smoke_run_writes_results_report_and_plots(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    done = subprocess.run([sys.executable, "-m", "benchmarks", "run", "--smoke", "--broker", "kafka",
                           "--out", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=480, check=False)
    assert done.returncode == 0, done.stderr[-3000:]

    results = json.loads((out / "results.json").read_text())
    assert {"limits", "throughput", "latency", "rounds"} <= results.keys()
    assert list(results["limits"]) == ["500"], "limits are measured per backlog size"
    assert _is_float(results["limits"]["500"]["pg_recvlogical_eps"])
    assert _is_float(results["limits"]["500"]["producer_eps"])
    assert _is_float(results["limits"]["500"]["producer_broker_cpu_us_per_event"])
    assert (results["broker"]["kind"], results["broker"]["version"]) == ("kafka", "4.1.2")
    assert results["plan"]["broker"] == "kafka"
    assert len(results["rounds"]) == 1 and results["throughput"][0]["rounds"] == 1

    assert [t["mode"] for t in results["throughput"]] == MODES
    for entry in results["throughput"]:
        assert isinstance(entry["events"], int) and entry["events"] > 0
        for key in ("seconds", "eps", "pg_cpu_s", "relay_cpu_s", "relay_peak_rss_mb",
                    "broker_cpu_us_per_event", "consumer_cpu_us_per_event"):
            assert _is_float(entry[key]), (key, entry[key])

    table = results["throughput"][-1]
    assert table["workload"] == "table" and _is_float(table["tombstones_per_event"])
    assert [(e["mode"], e["rate_eps"]) for e in results["latency"]] == [(m, 50) for m in LATENCY_MODES]
    for entry in results["latency"]:
        assert isinstance(entry["rate_eps"], int)
        for key in ("p50_ms", "p95_ms", "p99_ms", "max_ms"):
            assert _is_float(entry[key]), (key, entry[key])
        assert entry["missing"] == 0
    assert results["latency_floor"], "the broker floor is reported"

    report = (out / "report.md").read_text()
    assert results["skipped"] == {}, "no Debezium mode was asked for, none is reported skipped"
    for section in ("## Headline", "## Machine", "## Limits", "## Backlog throughput", "## Latency",
                    "## Targets"):
        assert section in report
    assert "- wal-wal2json, 500 events: " in report, "the targets are checked per backlog size"
    assert "| wal-wal2json | " in report.split("## Machine")[0], "the headline's WAL table"
    assert "- **Broker**: Apache Kafka 4.1.2, single-node KRaft" in report
    assert "| capture-pgoutput | " in report.split("**Table CDC**")[1].split("## Machine")[0]
    for plot in ("throughput.png", "latency_cdf_wal-wal2json.png", "latency_cdf_poll-notify.png"):
        assert (out / plot).stat().st_size > 1000, plot


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed")
def test_instruction_count_runs_the_relay_under_callgrind(tmp_path: Path) -> None:
    out = tmp_path / "ir"
    done = subprocess.run([sys.executable, "-m", "benchmarks", "instructions", "--events", "1000",
                           "--plugins", "pgoutput", "--out", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]

    counted = json.loads((out / "instructions.json").read_text())
    assert counted["events"] == 1000 and list(counted["plugins"]) == ["pgoutput"]
    pgoutput = counted["plugins"]["pgoutput"]
    assert pgoutput["backlog"]["main"] > pgoutput["idle"]["main"] > 0
    assert pgoutput["backlog"]["threads"] > 1, "librdkafka's threads are counted apart"
    assert 0 < pgoutput["main_per_event"] <= pgoutput["process_per_event"]
    assert "| pgoutput |" in done.stdout
