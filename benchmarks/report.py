"""Output of a run: results.json, report.md and PNG plots, all from the results dict.

``write_all(results, out)`` needs nothing but the dict, so ``python -m benchmarks report
DIR`` can redraw an old run's report from its results.json. Must not: measure.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

Results = dict[str, Any]


WAL_PLUGINS = {"wal-wal2json": "wal2json", "wal-pgoutput": "pgoutput"}


def limits_at(results: Results, events: int) -> dict[str, Any]:
    """The limits measured with a backlog of ``events`` (or the largest size measured)."""
    limits = results["limits"]
    if "producer_eps" in limits:  # a results.json from before limits were per backlog size
        return dict(limits)
    return dict(limits.get(str(events)) or limits[max(limits, key=int)])


def limit_for(mode: str, limits: dict[str, Any]) -> tuple[float, str]:
    """The limit a mode is compared with, and its name.

    WAL modes and Debezium embedded: the slower of pg_recvlogical with the mode's plugin
    and the bare producer.
    Polling modes read no WAL: the bare producer. WAL modes with another sink
    (wal-rabbitmq, wal-nats, wal-sqs, wal-redis, wal-http, wal-kinesis): pg_recvlogical wal2json
    (no bare producer is measured for them).
    """
    producer = float(limits["producer_eps"])
    if mode.startswith(("wal-rabbitmq", "wal-nats", "wal-sqs", "wal-redis", "wal-http",
                        "wal-kinesis")):
        return float(limits.get("pg_recvlogical_wal2json_eps", limits["pg_recvlogical_eps"])), \
            "pg_recvlogical wal2json"
    plugin = next((p for m, p in WAL_PLUGINS.items() if mode.startswith(m)), None)
    if mode.startswith("debezium-embedded"):  # Debezium reads pgoutput (benchmarks/debezium.py)
        plugin = "pgoutput"
    if plugin is None:
        return producer, "producer"
    decoding = float(limits.get(f"pg_recvlogical_{plugin}_eps", limits["pg_recvlogical_eps"]))
    return (decoding, f"pg_recvlogical {plugin}") if decoding < producer else (producer, "producer")


def spread(entry: dict[str, Any], key: str, digits: int = 0) -> str:
    """``median (min-max)`` of a folded field; just the value when there was one round."""
    value = entry.get(key)
    if value is None:
        return "n/a"
    low, high = entry.get(f"{key}_min"), entry.get(f"{key}_max")
    text = _fmt(float(value), digits)
    if low is None or high is None:
        return text
    return f"{text} ({_fmt(float(low), digits)}-{_fmt(float(high), digits)})"


def _fmt(value: Any, digits: int = 1) -> str:
    if isinstance(value, float):
        return "n/a" if math.isnan(value) else f"{value:,.{digits}f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _table(headers: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(_fmt(v) if not isinstance(v, str) else v for v in row) + " |"
              for row in rows]
    return "\n".join(lines)


def throughput_table(results: Results) -> str:
    """The backlog throughput table (markdown): medians with min-max over the rounds."""
    rows = []
    for t in results["throughput"]:
        limit, name = limit_for(t["mode"], limits_at(results, t["events"]))
        ratio = {"x": t["eps"] / limit}
        if "eps_min" in t:
            ratio.update(x_min=t["eps_min"] / limit, x_max=t["eps_max"] / limit)
        rows.append([t["mode"], t["events"], spread(t, "seconds", 2), spread(t, "eps"),
                     spread(t, "steady_eps"), f"{spread(ratio, 'x', 2)} ({name})",
                     spread(t, "acked_s", 2), _fmt(t.get("pg_cpu_us_per_event", float("nan")), 1),
                     _fmt(t.get("wal_bytes_per_event", float("nan")), 0),
                     _fmt(t.get("rows_written_per_event", float("nan")), 2),
                     spread(t, "relay_cpu_us_per_event", 1), spread(t, "relay_peak_rss_mb"),
                     _cpu(t, "broker_cpu_us_per_event"), _cpu(t, "consumer_cpu_us_per_event"),
                     _fmt(t.get("foreign_cpu_s", float("nan")), 1)])
    return _table(["mode", "events", "seconds", "events/s", "steady events/s", "ratio to limit",
                   "PostgreSQL knew at s", "PG CPU µs/event", "extra WAL B/event",
                   "rows written/event", "relay CPU µs/event", "relay peak RSS MB",
                   "broker CPU µs/event", "consumer CPU µs/event", "other procs CPU s"], rows)


def _cpu(entry: dict[str, Any], field: str) -> str:
    """A CPU figure older results (or a machine broker, not ours to read) lack: '-'."""
    value = entry.get(field)
    if not isinstance(value, int | float) or math.isnan(value):
        return "-"
    return spread(entry, field, 1)


def floor_at(results: Results, rate: int, linger_ms: int = 5) -> dict[str, Any] | None:
    """The broker floor measured at ``rate`` with ``linger_ms``, if any."""
    for floor in results.get("latency_floor", []):
        if floor["rate_eps"] == rate and floor.get("producer_linger_ms") == linger_ms:
            return dict(floor)
    return None


def latency_table(results: Results) -> str:
    """The latency table (markdown), the broker floors first."""
    rows = []
    for e in [*results.get("latency_floor", []), *results["latency"]]:
        floor = None if "producer_linger_ms" in e else floor_at(results, e["rate_eps"])
        over = e["p50_ms"] - floor["p50_ms"] if floor and floor["p50_ms"] is not None else float("nan")
        mode = e["mode"] + (f" (linger.ms={e['producer_linger_ms']})" if "producer_linger_ms" in e else "")
        rows.append([mode, e["rate_eps"], spread(e, "p50_ms", 2), _fmt(e["p95_ms"], 2),
                     spread(e, "p99_ms", 2), _fmt(e["max_ms"], 2),
                     "" if "producer_linger_ms" in e else _fmt(over, 2), e.get("samples", 0),
                     e.get("missing", 0), e.get("duplicates", 0),
                     _fmt(e.get("foreign_cpu_s", float("nan")), 1)])
    return _table(["mode", "rate events/s", "p50 ms", "p95 ms", "p99 ms", "max ms",
                   "p50 over floor ms", "samples", "missing", "duplicates", "other procs CPU s"],
                  rows)


def limits_table(results: Results) -> str:
    """The limits table (markdown), one row per limit and backlog size."""
    nan = float("nan")
    per_size = "producer_eps" not in results["limits"]
    rows = []
    for size in sorted(results["limits"], key=int) if per_size else ["0"]:
        limits = limits_at(results, int(size))
        label = f" ({int(size):,} events)" if per_size else ""
        rows += [[f"pg_recvlogical {p}{label}", spread(limits, f"pg_recvlogical_{p}_eps"),
                  _fmt(limits.get(f"pg_recvlogical_{p}_pg_cpu_s", nan), 2),
                  "-", _fmt(limits.get(f"pg_recvlogical_{p}_foreign_cpu_s", nan), 1)]
                 for p in ("wal2json", "pgoutput") if f"pg_recvlogical_{p}_eps" in limits]
        rows.append([f"bare idempotent producer{label}", spread(limits, "producer_eps"), "-",
                     _cpu(limits, "producer_broker_cpu_us_per_event"),
                     _fmt(limits.get("producer_foreign_cpu_s", nan), 1)])
    return _table(["limit", "events/s", "PG CPU s", "broker CPU µs/event", "other procs CPU s"],
                  rows)


# (mode, target ratio to its limit overall, target ratio steady)
_WAL_TARGETS = {"wal-wal2json": (0.85, 0.95), "wal-pgoutput": (0.8, 0.9)}
_CONFIRM_TARGET_S = 0.1
_CPU_TARGET_US = 8.0
_RSS_TARGET_MB = 150.0


def _verdict(ok: bool) -> str:
    return "met" if ok else "**NOT met**"


def targets(results: Results) -> list[str]:
    """The performance targets, checked against this run's medians (reported, never asserted)."""
    lines = []
    by_mode = {(t["mode"], t["events"]): t for t in results["throughput"]}
    for (mode, events), t in by_mode.items():
        limit, name = limit_for(mode, limits_at(results, events))
        goal = _WAL_TARGETS.get(mode)
        if goal:
            overall, steady = t["eps"] / limit, t.get("steady_eps", 0.0) / limit
            lines.append(f"- {mode}, {events:,} events: {overall:.2f} x {name} (target ≥ {goal[0]}): "
                         f"{_verdict(overall >= goal[0])}; steady {steady:.2f} x (target ≥ {goal[1]}): "
                         f"{_verdict(steady >= goal[1])}")
        if mode.startswith("wal-") and "acked_s" in t:
            lag = t["acked_s"] - t["seconds"]
            lines.append(f"- {mode}, {events:,} events: slot confirmed {lag * 1000:,.0f} ms after the "
                         f"consumer held the last event (target ≤ {_CONFIRM_TARGET_S * 1000:.0f} ms): "
                         f"{_verdict(lag <= _CONFIRM_TARGET_S)}")
        if mode in _WAL_TARGETS:
            cpu, rss = t["relay_cpu_us_per_event"], t["relay_peak_rss_mb"]
            lines.append(f"- {mode}, {events:,} events: relay CPU {cpu:.1f} µs/event (target ≤ "
                         f"{_CPU_TARGET_US:g}): {_verdict(cpu <= _CPU_TARGET_US)}; peak RSS {rss:.0f} MB "
                         f"(target ≤ {_RSS_TARGET_MB:.0f}): {_verdict(rss <= _RSS_TARGET_MB)}")
    lines += _polling_targets(by_mode)
    lines += _latency_targets(results)
    return lines


def _polling_targets(by_mode: dict[tuple[str, int], dict[str, Any]]) -> list[str]:
    lines = []
    for (mode, events), classic in by_mode.items():
        if mode != "poll-classic":
            continue
        for other, goal in (("poll-1s", 2.0), ("poll-batch500", 3.0)):
            t = by_mode.get((other, events))
            if t:
                ratio = t["eps"] / classic["eps"]
                lines.append(f"- {other}, {events:,} events: {ratio:.2f} x the classic relay "
                             f"(target ≥ {goal:g}): {_verdict(ratio >= goal)}")
    return lines


def _latency_targets(results: Results) -> list[str]:
    lines = []
    floor = floor_at(results, 1000)
    for e in results["latency"]:
        if e["rate_eps"] != 1000:
            continue
        if e["mode"] == "poll-notify":
            lines.append(f"- poll-notify p50 at 1,000 events/s: {e['p50_ms']:.2f} ms (target ≤ 10 ms): "
                         f"{_verdict(e['p50_ms'] <= 10)}")
        if e["mode"] in _WAL_TARGETS and floor and floor.get("p50_ms") is not None:
            over = e["p50_ms"] - floor["p50_ms"]
            p99 = e["p99_ms"] / floor["p99_ms"] if floor.get("p99_ms") else float("nan")
            lines.append(f"- {e['mode']} at 1,000 events/s: p50 {over:+.2f} ms over the broker floor "
                         f"(target ≤ +1 ms): {_verdict(over <= 1.0)}; p99 {p99:.2f} x the floor's p99 "
                         f"(target ≤ 1.3): {_verdict(p99 <= 1.3)}")
    return lines


def markdown(results: Results) -> str:
    """report.md."""
    from benchmarks.headline import section  # it builds on this module's tables

    m = results["machine"]
    out = [f"# cdc-relay benchmark ({results['plan']['label']} run, {results['started_at']})", "",
           f"Command: `{results['command']}`  ", f"Duration: {results['wall_seconds']:.0f} s; "
           f"load average at start {results['load_start']}, at end {results['load_end']}.  ",
           f"Other processes on the machine used {results.get('foreign_cpu_s', float('nan')):.1f} "
           "CPU seconds during the run (the *other procs CPU s* columns: per measurement; "
           "a few tenths is the machine's idle background, more means the figure was disturbed).",
           "",
           "## Headline", "", section(results), "",
           "## Machine", "",
           _table(["", ""], [[k.replace("_", " "), str(v)] for k, v in m.items()]), "",
           "## Limits", "", limits_table(results), "",
           "## Backlog throughput", "",
           "Backlogs of " + " and ".join(f"{n:,}" for n in results["plan"].get(
               "sizes", [results["plan"]["events"]])) + " events preloaded in transactions of 100 "
           "(~200 B payloads); seconds = relay spawn → consumer holds every event; *PostgreSQL "
           "knew at*: when the slot's confirmed position (WAL) or the rows (polling) recorded "
           "the whole backlog. ratio to limit: events/s over the mode's limit (see README). "
           f"Figures: median (min-max) of {results['plan'].get('rounds', 1)} round(s).", "",
           throughput_table(results), "",
           "## Latency (commit → consumer receipt)", "",
           f"{results['plan']['duration']:g} s measured per rate after a "
           f"{results['plan']['warmup']:g} s warm-up; consumer fetch.wait.max.ms="
           f"{results['plan']['fetch_wait_max_ms']}. The broker floor (bare producer → consumer, "
           "same rate, same duration, the relay's linger.ms=5) is the least any mode can show; "
           "*p50 over floor* is what the relay and PostgreSQL add.", "",
           latency_table(results), "", "## Targets", "", *targets(results), "",
           "## Plots", "", *[f"- `{p}`" for p in results.get("plots", [])], ""]
    return "\n".join(out)


def _cdf(ax: Any, entry: dict[str, Any], label: str, **style: Any) -> None:
    values = entry.get("cdf_ms") or []
    if values:
        n = len(values)
        ax.plot(values, [i / (n - 1) for i in range(n)], label=label, **style)


def plots(results: Results, out: Path) -> list[str]:
    """Write the PNGs; return their file names."""
    names = []
    floors = results.get("latency_floor", [])
    modes = list(dict.fromkeys(e["mode"] for e in results["latency"]))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for mode in modes:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        entries = [e for e in results["latency"] if e["mode"] == mode]
        for color, entry in zip(colors, entries, strict=False):
            _cdf(ax, entry, f"{entry['rate_eps']:,} events/s", color=color)
            floor = floor_at(results, entry["rate_eps"])
            if floor:
                _cdf(ax, floor, f"broker floor at {entry['rate_eps']:,}/s", color=color,
                     linestyle="--", alpha=0.6)
        for floor in floors:
            if floor.get("producer_linger_ms") == 0:
                _cdf(ax, floor, f"broker floor at {floor['rate_eps']:,}/s, linger.ms=0",
                     color="grey", linestyle=":")
        ax.set(xscale="log", xlabel="commit → receipt latency (ms)", ylabel="fraction of events",
               title=f"Latency CDF: {mode} (dashed: bare producer → consumer)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(loc="lower right", fontsize="small")
        names.append(_save(fig, out, f"latency_cdf_{mode}.png"))
    rates = sorted({e["rate_eps"] for e in results["latency"]})
    if rates:
        fig, axes = plt.subplots(1, len(rates), figsize=(5.5 * len(rates), 4.5), squeeze=False)
        for ax, rate in zip(axes[0], rates, strict=True):
            for entry in results["latency"]:
                if entry["rate_eps"] == rate:
                    _cdf(ax, entry, entry["mode"])
            floor = floor_at(results, rate)
            if floor:
                _cdf(ax, floor, "broker floor", color="black", linestyle="--")
            ax.set(xscale="log", xlabel="latency (ms)", title=f"{rate:,} events/s")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(loc="lower right", fontsize="small")
        axes[0][0].set_ylabel("fraction of events")
        names.append(_save(fig, out, "latency_cdf_by_rate.png"))
    if results["throughput"]:
        names.append(_throughput_plot(results, out))
        names.append(_cost_plot(results, out))
    return names


def _throughput_plot(results: Results, out: Path) -> str:
    largest = max(t["events"] for t in results["throughput"])
    limits = limits_at(results, largest)
    rows = [t for t in results["throughput"] if t["events"] == largest]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    modes = [t["mode"] for t in rows]
    ax.bar(modes, [t.get("steady_eps", 0) for t in rows], color="#c6dbef",
           label="steady (first → last receipt)")
    ax.bar(modes, [t["eps"] for t in rows], color="#3182bd", width=0.6,
           label="overall (spawn → last receipt)")
    if all("eps_min" in t for t in rows):
        ax.errorbar(modes, [t["eps"] for t in rows], fmt="none", ecolor="black", capsize=3,
                    yerr=[[t["eps"] - t["eps_min"] for t in rows], [t["eps_max"] - t["eps"] for t in rows]])
    lines = [("pg_recvlogical_wal2json_eps", "pg_recvlogical wal2json", "tab:red"),
             ("pg_recvlogical_pgoutput_eps", "pg_recvlogical pgoutput", "tab:orange"),
             ("producer_eps", "bare producer", "tab:green")]
    for key, label, color in lines:
        if key in limits:
            ax.axhline(limits[key], color=color, linestyle="--", label=f"{label} {limits[key]:,.0f}/s")
    ax.set(ylabel="events/s", title=f"Backlog throughput ({largest:,} events; bars: median, "
                                    "whiskers: min-max)")
    ax.legend(fontsize="small")
    ax.tick_params(axis="x", labelrotation=15)
    return _save(fig, out, "throughput.png")


def _cost_plot(results: Results, out: Path) -> str:
    largest = max(t["events"] for t in results["throughput"])
    rows = [t for t in results["throughput"] if t["events"] == largest]
    modes = [t["mode"] for t in rows]
    fig, axes = plt.subplots(1, 4, figsize=(18, 4))
    for ax, key, title in ((axes[0], "pg_cpu_us_per_event", "PostgreSQL CPU µs / event"),
                           (axes[1], "wal_bytes_per_event", "extra WAL bytes / event"),
                           (axes[2], "relay_cpu_us_per_event", "relay CPU µs / event"),
                           (axes[3], "broker_cpu_us_per_event", "broker CPU µs / event")):
        ax.bar(modes, [_number(t.get(key)) for t in rows], color="#756bb1")
        ax.set_title(title)
        ax.tick_params(axis="x", labelrotation=30)
    return _save(fig, out, "cost_per_event.png")


def _number(value: Any) -> float:
    """A bar's height: 0 for a figure that was not read (None, NaN)."""
    return float(value) if isinstance(value, int | float) and not math.isnan(value) else 0.0


def _save(fig: Any, out: Path, name: str) -> str:
    fig.tight_layout()
    fig.savefig(out / name, dpi=110)
    plt.close(fig)
    return name


def _no_nan(value: Any) -> Any:
    """NaN (no sample at all) becomes null: results.json stays strict JSON."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _no_nan(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_no_nan(v) for v in value]
    return value


def write_all(results: Results, out: Path) -> None:
    """results.json, the plots, then report.md (which lists them)."""
    out.mkdir(parents=True, exist_ok=True)
    results["plots"] = plots(results, out)
    (out / "results.json").write_text(json.dumps(_no_nan(results), indent=2) + "\n")
    (out / "report.md").write_text(markdown(results))
