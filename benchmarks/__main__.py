"""``python -m benchmarks run|report|instructions``: the benchmark's command line.

``run`` measures (see benchmarks/README.md) and writes DIR/results.json, report.md and
the plots; ``report`` redraws report.md and the plots from an existing results.json;
``instructions`` counts the relay's instructions per event under callgrind
(benchmarks/instructions.py).
Exit code 0 when every mode was measured, 1 when one failed (the others are still
reported), 130 on Ctrl-C (everything started is stopped).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import shlex
import signal
import sys
import time
import traceback
from pathlib import Path
from types import FrameType
from typing import Any

import click

from benchmarks import debezium, message_check
from benchmarks.brokers import BROKERS, DEFAULT_BROKER, KAFKA_VERSION, describe
from benchmarks.headline import message_check as message_check_line
from benchmarks.headline import update_readme
from benchmarks.instructions import PLUGINS
from benchmarks.instructions import run as count_instructions
from benchmarks.kafka_side import FETCH_WAIT_MS
from benchmarks.limits import broker_floor, producer_limit, recvlogical_limits
from benchmarks.machine import load_average, machine_info
from benchmarks.noise import NoiseMeter
from benchmarks.plan import (
    DEFAULT_MODES,
    FULL_DURATION,
    FULL_EVENTS,
    FULL_RATES,
    FULL_ROUNDS,
    MODES,
    QUICK_DURATION,
    QUICK_EVENTS,
    QUICK_RATES,
    QUICK_ROUNDS,
    TABLE_CDC_MODES,
    Plan,
    parse_modes,
)
from benchmarks.procs import byte_compile, code_under_test
from benchmarks.procstat import postmaster_pid
from benchmarks.progress import Progress
from benchmarks.report import write_all
from benchmarks.rounds import fold_entries, fold_limits
from benchmarks.runner import ModeRun
from cdc_relay.errors import LocalServiceError
from cdc_relay.local.postgres import PostgresCluster

SMOKE_MODES = "wal-wal2json,poll-notify,poll-classic,capture-pgoutput"
INSTRUCTION_EVENTS = 20_000  # enough that start-up's variation is well under 1 %
RELAY_LINGER_MS = 5  # the relay's default linger.ms: the floor at every rate uses it


def _ints(text: str, what: str, minimum: int) -> tuple[int, ...]:
    try:
        values = tuple(int(r.replace("_", "")) for r in text.split(",") if r.strip())
    except ValueError as exc:
        raise click.BadParameter(f"not a list of integers: {text!r}") from exc
    if not values or min(values) < minimum:
        raise click.BadParameter(f"{what} must be integers of at least {minimum}")
    return values


def build_plan(out: Path, quick: bool, smoke: bool, modes: str | None, events: str | None,
               rates: str | None, duration: float | None, warmup: float | None,
               relay_producer_config: tuple[str, ...], rounds: int | None = None,
               broker: str = DEFAULT_BROKER, broker_warmup: int = 1, table_cdc: bool = False) -> Plan:
    """The Plan from the command line: full by default, then --quick/--smoke, then overrides
    (``--broker`` is not one: it names the broker, not the workload); ``table_cdc`` adds the
    table-CDC modes (plan.TABLE_CDC_MODES) to the modes chosen."""
    label = "smoke" if smoke else "quick" if quick else "full"
    base = {"full": (FULL_EVENTS, FULL_RATES, FULL_DURATION, 1.0, ",".join(DEFAULT_MODES), FULL_ROUNDS),
            "quick": (QUICK_EVENTS, QUICK_RATES, QUICK_DURATION, 1.0, ",".join(DEFAULT_MODES),
                      QUICK_ROUNDS),
            "smoke": ((500,), (50,), 2.0, 0.5, SMOKE_MODES, 1)}[label]
    try:
        parsed_modes = parse_modes(",".join([modes or base[4], *(TABLE_CDC_MODES if table_cdc else ())]))
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--modes") from exc
    if events is not None or rates or duration is not None or modes or rounds is not None:
        label += " (custom)"
    extra = tuple(arg for kv in relay_producer_config for arg in ("--producer-config", kv))
    chosen_rates = _ints(rates, "rates", 1) if rates else base[1]
    return Plan(out=out, modes=parsed_modes, sizes=_ints(events, "--events", 100) if events else base[0],
                rounds=rounds if rounds is not None else base[5], rates=chosen_rates,
                duration=duration if duration is not None else base[2],
                warmup=warmup if warmup is not None else base[3],
                floor_rate=min(1_000, max(chosen_rates)), label=label, relay_extra=extra,
                broker=broker, broker_warmup=broker_warmup)


@click.group()
def main() -> None:
    """cdc-relay benchmarks: WAL mode vs polling vs the machine's limits."""


@main.command()
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Directory for results.json, report.md, the plots and logs/.")
@click.option("--quick", is_flag=True, help=f"{QUICK_EVENTS[0]:,} events, rates {QUICK_RATES}, one round, "
              f"{QUICK_DURATION:.0f} s per rate (a few minutes).")
@click.option("--modes", default=None, help=f"Comma-separated subset of: {', '.join(MODES)}.")
@click.option("--events", default=None, metavar="N[,N…]",
              help=f"Backlog sizes (full: {', '.join(f'{n:,}' for n in FULL_EVENTS)}).")
@click.option("--rounds", type=click.IntRange(1), default=None,
              help=f"Repeat every measurement N times; figures are medians with min-max "
                   f"(full: {FULL_ROUNDS}, --quick: {QUICK_ROUNDS}).")
@click.option("--broker", type=click.Choice(BROKERS), default=DEFAULT_BROKER, show_default=True,
              help=f"The Kafka broker every measurement runs against, a fresh one each: kafka "
                   f"(Apache Kafka {KAFKA_VERSION}, single-node KRaft; needs Java 17+) or tansu "
                   f"(memory only, no JVM).")
@click.option("--broker-warmup", type=click.IntRange(1), default=1, hidden=True, metavar="N",
              help="Messages produced and consumed through each fresh broker before a mode "
                   "(more: a warm JVM).")
@click.option("--table-cdc", is_flag=True,
              help=f"Also measure table CDC: {', '.join(TABLE_CDC_MODES)} (a captured table's "
                   "mixed backlog, cdc-relay beside Debezium embedded; throughput only).")
@click.option("--smoke", is_flag=True, hidden=True, help="Tiny run for the smoke test.")
@click.option("--rates", default=None, hidden=True, help="Insert rates, e.g. 100,1000.")
@click.option("--duration", type=click.FloatRange(0.5), default=None, hidden=True,
              help="Measured seconds per rate.")
@click.option("--warmup", type=click.FloatRange(0), default=None, hidden=True)
@click.option("--relay-producer-config", multiple=True, hidden=True, metavar="KEY=VALUE",
              help="Passed to every relay as --producer-config.")
def run(out: Path, quick: bool, modes: str | None, events: str | None, rounds: int | None,
        broker: str, broker_warmup: int, table_cdc: bool, smoke: bool, rates: str | None,
        duration: float | None, warmup: float | None, relay_producer_config: tuple[str, ...]) -> None:
    """Measure limits, backlog throughput and latency; write DIR/results.json and report.md."""
    plan = build_plan(out, quick, smoke, modes, events, rates, duration, warmup,
                      relay_producer_config, rounds, broker, broker_warmup, table_cdc)
    plan, skipped = without_unavailable(plan)
    workdir = out / "logs"
    workdir.mkdir(parents=True, exist_ok=True)
    byte_compile(*code_under_test())  # every relay starts as an installed one (procs.py)
    results: dict[str, Any] = {
        "plan": {"label": plan.label, "events": plan.events, "sizes": list(plan.sizes),
                 "rounds": plan.rounds, "rates": list(plan.rates),
                 "duration": plan.duration, "warmup": plan.warmup, "floor_rate": plan.floor_rate,
                 "modes": [m.name for m in plan.modes], "fetch_wait_max_ms": FETCH_WAIT_MS,
                 "relay_extra_args": list(plan.relay_extra), "broker": plan.broker,
                 "broker_warmup": plan.broker_warmup},
        "command": shlex.join(["python", "-m", "benchmarks", *sys.argv[1:]]),
        "started_at": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "load_start": load_average(), "rounds": [], "errors": [], "skipped": skipped,
    }
    _interrupt_on_signals()
    started = time.monotonic()
    meter = NoiseMeter()
    meter.start()
    progress = Progress(f"cdc-relay benchmark ({plan.label})", meter=meter)
    try:
        with progress, PostgresCluster(settings={"full_page_writes": "on"}) as cluster:
            cluster.require_plugin("wal2json")
            meter.add_root(postmaster_pid(cluster.data_dir))
            results["machine"] = machine_info(cluster, plan.broker)
            results["broker"] = describe(plan.broker, results["machine"]["tansu"])
            if any(m.is_debezium and m.workload == "outbox" for m in plan.modes):
                progress.phase("message check", "cdc-relay and Debezium relay one sample")
                results["message_check"] = message_check.run(cluster, workdir, plan.broker)
                progress.result(message_check_line(results))
            for number in range(1, plan.rounds + 1):
                progress.result(f"round {number} of {plan.rounds}")
                results["rounds"].append(_measure(plan, cluster, progress, workdir, results["errors"]))
            _fold(results)
    except LocalServiceError as exc:
        raise click.ClickException(str(exc)) from exc
    except KeyboardInterrupt:
        click.echo("interrupted: everything the benchmark started has been stopped; no results "
                   "written", err=True)
        sys.exit(130)
    finally:
        meter.stop()
    results["foreign_cpu_s"] = round(meter.foreign_s, 1)
    results["phases"] = progress.phases
    results["wall_seconds"] = round(time.monotonic() - started, 1)
    results["load_end"] = load_average()
    write_all(results, out)
    click.echo(f"wrote {out / 'results.json'} and {out / 'report.md'} "
               f"({results['wall_seconds']:.0f} s)", err=True)
    if results["errors"]:
        for error in results["errors"]:
            click.echo(f"error in {error['mode']}: {error['error']}", err=True)
        sys.exit(1)


def without_unavailable(plan: Plan, reason: str | None = "probe") -> tuple[Plan, dict[str, str]]:
    """The plan without the Debezium modes where they cannot run, and why (one line, printed).

    ``reason`` replaces the probe (tests): None when Debezium can run.
    """
    chosen = [m.name for m in plan.modes if m.is_debezium]
    if not chosen:
        return plan, {}
    why = debezium.unavailable() if reason == "probe" else reason
    if why is None:
        return plan, {}
    click.echo(debezium.skip_line(chosen, why), err=True)
    return (dataclasses.replace(plan, modes=tuple(m for m in plan.modes if not m.is_debezium)),
            dict.fromkeys(chosen, why))


def _interrupt_on_signals() -> None:
    """SIGINT and SIGTERM raise KeyboardInterrupt, so the ``finally`` blocks stop everything.

    Installed explicitly: a shell starts background jobs with SIGINT ignored, and a CI
    runner cancels with SIGTERM.
    """
    def handler(_signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)


def _measure(plan: Plan, cluster: PostgresCluster, progress: Progress, workdir: Path,
             errors: list[dict[str, Any]]) -> dict[str, Any]:
    """One round: the limits at every backlog size, the broker floors, then every mode."""
    one: dict[str, Any] = {"limits": {}, "throughput": [], "latency": [], "latency_floor": []}
    for events in plan.sizes:
        limits = one["limits"][str(events)] = {}
        for plugin, r in recvlogical_limits(cluster, events, progress, workdir).items():
            limits[f"pg_recvlogical_{plugin}_eps"] = round(r["eps"], 1)
            limits[f"pg_recvlogical_{plugin}_seconds"] = round(r["seconds"], 3)
            limits[f"pg_recvlogical_{plugin}_pg_cpu_s"] = round(r["pg_cpu_s"], 2)
            limits[f"pg_recvlogical_{plugin}_foreign_cpu_s"] = r["foreign_cpu_s"]
        limits["pg_recvlogical_eps"] = limits["pg_recvlogical_wal2json_eps"]
        producer = producer_limit(events, progress, workdir, plan.broker)
        limits["producer_eps"] = round(producer["eps"], 1)
        limits["producer_broker_cpu_us_per_event"] = producer["broker_cpu_us_per_event"]
        limits["producer_seconds"] = round(producer["seconds"], 3)
        limits["producer_foreign_cpu_s"] = producer["foreign_cpu_s"]
    for rate in plan.rates:
        one["latency_floor"].append(broker_floor(plan, progress, workdir, rate, RELAY_LINGER_MS))
    # and what the producer's linger costs at low rates
    one["latency_floor"].append(broker_floor(plan, progress, workdir, plan.floor_rate, 0))
    for mode in plan.modes:
        mode_run = ModeRun(plan, mode, cluster, progress, workdir)
        try:
            throughput, latency = mode_run.run()
        except Exception as exc:  # one broken mode must not cost the others' figures
            progress.result(f"{mode.name} FAILED: {exc}")
            (workdir / f"{mode.name}-error.txt").write_text(traceback.format_exc())
            errors.append({"mode": mode.name, "error": str(exc)[:2000]})
            continue
        errors.extend({"mode": mode.name, "error": error[:2000]} for error in mode_run.errors)
        one["throughput"].extend(throughput)
        one["latency"].extend(latency)
    return one


def _fold(results: dict[str, Any]) -> None:
    """The rounds' medians (with min-max) become the run's figures."""
    rounds = results["rounds"]
    results["limits"] = fold_limits([r["limits"] for r in rounds])
    for part in ("throughput", "latency", "latency_floor"):
        results[part] = fold_entries([r[part] for r in rounds])
    for one in rounds:  # the folded entries keep a CDF; the rounds' copies would only bloat
        for entry in (*one["latency"], *one["latency_floor"]):
            entry.pop("cdf_ms", None)


@main.command()
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Directory for instructions.json and logs/ (callgrind's files).")
@click.option("--events", type=click.IntRange(1_000), default=INSTRUCTION_EVENTS, show_default=True,
              help="Backlog size.")
@click.option("--plugins", default=",".join(PLUGINS), show_default=True,
              help="Comma-separated subset of: wal2json, pgoutput.")
def instructions(out: Path, events: int, plugins: str) -> None:
    """Count the relay's instructions per event under callgrind (about a minute).

    A cost that does not move with the machine's speed: compare two commits by it.
    """
    chosen = tuple(p.strip() for p in plugins.split(",") if p.strip())
    unknown = [p for p in chosen if p not in PLUGINS]
    if not chosen or unknown:
        raise click.BadParameter(f"choose from {', '.join(PLUGINS)}", param_hint="--plugins")
    _interrupt_on_signals()
    try:
        click.echo(count_instructions(events, chosen, out))
    except (LocalServiceError, RuntimeError) as exc:
        raise click.ClickException(str(exc)) from exc
    except KeyboardInterrupt:
        click.echo("interrupted: everything the benchmark started has been stopped", err=True)
        sys.exit(130)


@main.command()
@click.argument("directory", type=click.Path(file_okay=False, exists=True, path_type=Path))
@click.option("--readme", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              default=None, help="Also rewrite this README's headline section "
                                 "(benchmarks/README.md) from the run.")
@click.option("--beside", type=click.Path(file_okay=False, exists=True, path_type=Path),
              default=None, help="Another run's directory (e.g. the same modes with --broker tansu): "
                                 "its figures go beside this run's in the README's headline.")
def report(directory: Path, readme: Path | None, beside: Path | None) -> None:
    """Redraw report.md and the plots from DIRECTORY/results.json."""
    results = _read_results(directory)
    other = _read_results(beside) if beside is not None else None
    if readme is not None:  # first: a README without its markers fails before anything is drawn
        try:
            update_readme(readme, results, other)
        except ValueError as exc:
            raise click.ClickException(str(exc)) from exc
        click.echo(f"wrote the headline of {readme}")
    write_all(results, directory)
    click.echo(f"wrote {directory / 'report.md'}")


def _read_results(directory: Path) -> dict[str, Any]:
    try:
        loaded: dict[str, Any] = json.loads((directory / "results.json").read_text())
    except (OSError, ValueError) as exc:
        raise click.ClickException(f"cannot read {directory / 'results.json'}: {exc}") from exc
    return loaded


if __name__ == "__main__":
    main()
