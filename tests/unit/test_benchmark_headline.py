"""The benchmark README's headline is generated from a results.json (benchmarks/headline.py)."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from benchmarks.__main__ import main
from benchmarks.brokers import describe
from benchmarks.headline import BEGIN, END, beside_table, section, update_readme

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "bench_results.json"


@pytest.fixture
def results() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(FIXTURE.read_text())
    return loaded


def _row(text: str, first_cell: str) -> list[str]:
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells[0] == first_cell:
            return cells
    raise AssertionError(f"no row {first_cell!r} in:\n{text}")


def test_the_headline_opens_with_the_environment(results: dict[str, Any]) -> None:
    text = section(results)
    assert "fsync=off" in text and "no fsync" in text
    assert "tansu 0.6.0, memory only" in text
    assert "2 cores (AMD EPYC)" in text
    assert "300 CPU s during the 600 s run (25% of 2 cores" in text
    assert "**a noisy run**" in text, "a quarter of the cores taken by others is flagged"


def test_the_wal_table_puts_cdc_relay_next_to_debezium_and_pg_recvlogical(
        results: dict[str, Any]) -> None:
    text = section(results)
    relay = _row(text, "wal-pgoutput")
    assert relay[1:4] == ["70,000", "0.58 x pg_recvlogical pgoutput", "10.00 x"]
    assert relay[4:10] == ["0.36", "16.0 / 30.0", "9.3", "10.0", "5.0", "51"], \
        "relay, PostgreSQL and broker CPU per event side by side"
    debezium = _row(text, "debezium-embedded")
    assert debezium[1:4] == ["7,000", "0.06 x pg_recvlogical pgoutput", "1.00 x"]
    assert debezium[9] == "829"
    server = _row(text, "pg_recvlogical pgoutput (the server's rate)")
    assert server[1] == "120,000" and server[3] == "17.14 x"
    producer = _row(text, "bare producer (the broker's rate)")
    assert producer[1:3] == ["240,000", "(the yardstick)"] and producer[8] == "-", \
        "an older run did not read the broker's CPU under the bare producer"
    assert server[7] == "10.0", "the walsender's CPU per event under pg_recvlogical"
    assert "20 events relayed by both" in text and "identical key, value, headers" in text


def test_the_polling_table_compares_with_the_classic_relay(results: dict[str, Any]) -> None:
    row = _row(section(results), "poll-1s")
    assert row[1:5] == ["12,000", "0.05 x producer", "2.00 x", "400"]
    assert "wal-pgoutput" not in section(results).split("**Polling mode**")[1]


def test_a_run_without_debezium_says_why_and_leaves_the_ratio_empty(
        results: dict[str, Any]) -> None:
    quiet = copy.deepcopy(results)
    quiet["throughput"] = [t for t in quiet["throughput"] if t["mode"] != "debezium-embedded"]
    quiet["skipped"] = {"debezium-embedded": "no java found"}
    quiet["foreign_cpu_s"] = 10.0
    del quiet["message_check"]
    text = section(quiet)
    assert _row(text, "wal-pgoutput")[3] == "-"
    assert "Debezium embedded was not measured: no java found." in text
    assert "a quiet run" in text and "Message check" not in text
    assert "Failed in this run" not in text

    quiet["errors"] = [{"mode": "wal-nats", "error": "latency at 5,000/s: too slow\ndetail"}]
    assert "- wal-nats: latency at 5,000/s: too slow\n" in section(quiet)


def test_a_run_that_measured_no_mode_still_has_a_headline(results: dict[str, Any]) -> None:
    empty = copy.deepcopy(results)
    empty["throughput"] = []
    assert section(empty).endswith("No mode was measured in this run.")


def test_update_readme_rewrites_only_the_marked_section(tmp_path: Path,
                                                       results: dict[str, Any]) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(f"# title\n\nintro\n\n{BEGIN}\nold figures\n{END}\n\n## Method\nkept\n")
    update_readme(readme, results)
    update_readme(readme, results)  # twice: the same page
    text = readme.read_text()
    assert text.startswith("# title\n\nintro\n\n" + BEGIN + "\n\n")
    assert text.endswith(END + "\n\n## Method\nkept\n")
    assert "old figures" not in text and text.count(BEGIN) == 1
    assert section(results) in text

    readme.write_text("# no markers\n")
    with pytest.raises(ValueError, match="no headline markers"):
        update_readme(readme, results)


@pytest.mark.slow  # draws the plots: ~10 s on a busy machine
def test_report_command_writes_the_readme_headline(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    shutil.copy(FIXTURE, run_dir / "results.json")
    readme = tmp_path / "README.md"
    readme.write_text(f"{BEGIN}\n{END}\n")

    done = CliRunner().invoke(main, ["report", str(run_dir), "--readme", str(readme)])

    assert done.exit_code == 0, done.output
    assert "| debezium-embedded | 7,000 |" in readme.read_text()
    report = (run_dir / "report.md").read_text()
    assert report.index("## Headline") < report.index("## Machine")


def test_report_command_refuses_a_readme_without_markers_in_one_line(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    shutil.copy(FIXTURE, run_dir / "results.json")
    readme = tmp_path / "README.md"
    readme.write_text("# plain\n")
    done = CliRunner().invoke(main, ["report", str(run_dir), "--readme", str(readme)])
    assert done.exit_code == 1
    assert "has no headline markers" in done.output and "Traceback" not in done.output


def _on_kafka(results: dict[str, Any]) -> dict[str, Any]:
    """The fixture as a run on Apache Kafka (``--broker kafka``) with other figures."""
    kafka = copy.deepcopy(results)
    kafka["broker"] = describe("kafka")
    kafka["command"] = "python -m benchmarks run --broker kafka"
    kafka["limits"]["100000"]["producer_broker_cpu_us_per_event"] = 12.5
    for t in kafka["throughput"]:
        t["eps"] = t["eps"] / 2
        t["broker_cpu_us_per_event"] = 20.0
    return kafka


def test_the_headline_names_the_broker_it_ran_on(results: dict[str, Any]) -> None:
    kafka = _on_kafka(results)
    text = section(kafka)
    assert "- **Broker**: Apache Kafka 4.1.2, single-node KRaft" in text
    assert "memory only" not in text
    assert _row(text, "bare producer (the broker's rate)")[8] == "12.5"
    assert _row(text, "wal-pgoutput")[8] == "20.0"


def test_another_runs_figures_go_beside_this_ones(results: dict[str, Any]) -> None:
    kafka = _on_kafka(results)
    text = section(kafka, beside=results)
    part = text.split("**Apache Kafka 4.1.2 beside tansu 0.6.0**")[1]
    assert "(100,000-event backlog; the tansu 0.6.0 run: `" in part
    header = [c.strip() for c in part.splitlines()[2].strip("|").split("|")]
    assert header[1:3] == ["events/s Kafka", "events/s Tansu"]
    assert _row(part, "wal-pgoutput")[1:3] == ["35,000", "70,000"]
    assert _row(part, "wal-pgoutput")[3:9] == ["16.0 / 30.0", "16.0 / 30.0", "9.3", "9.3",
                                               "20.0", "5.0"]
    assert _row(part, "bare producer")[7:9] == ["12.5", "-"]
    assert _row(part, "broker floor (linger.ms=5)")[3] == "8.0 / 20.0"
    assert "beside" not in section(kafka), "nothing beside unless asked"
    again = beside_table(kafka, _on_kafka(results))
    assert "| mode | events/s this run | events/s " in again, "two runs on one broker kind"


def test_runs_with_no_backlog_size_in_common_say_so(results: dict[str, Any]) -> None:
    other = copy.deepcopy(results)
    for t in other["throughput"]:
        t["events"] = 50_000
    assert beside_table(results, other) == "No backlog size was measured by both runs."
