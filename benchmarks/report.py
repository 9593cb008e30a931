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


def limit_for(mode: str, limits: dict[str, Any]) -> tuple[float, str]:
    """The limit a mode is compared with, and its name.

    WAL modes: the slower of pg_recvlogical with the mode's plugin and the bare producer.
    Polling modes read no WAL: the bare producer. WAL modes with another sink
    (wal-rabbitmq, wal-nats): pg_recvlogical wal2json (no bare producer is measured for them).
    """
    producer = float(limits["producer_eps"])
    if mode in ("wal-rabbitmq", "wal-nats"):
        return float(limits.get("pg_recvlogical_wal2json_eps", limits["pg_recvlogical_eps"])), \
            "pg_recvlogical wal2json"
    plugin = {"wal-wal2json": "wal2json", "wal-pgoutput": "pgoutput"}.get(mode)
    if plugin is None:
        return producer, "producer"
    decoding = float(limits.get(f"pg_recvlogical_{plugin}_eps", limits["pg_recvlogical_eps"]))
    return (decoding, f"pg_recvlogical {plugin}") if decoding < producer else (producer, "producer")


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
    """The backlog throughput table (markdown)."""
    rows = []
    for t in results["throughput"]:
        limit, name = limit_for(t["mode"], results["limits"])
        rows.append([t["mode"], t["events"], _fmt(t["seconds"], 2), _fmt(t["eps"], 0),
                     _fmt(t.get("steady_eps", float("nan")), 0), f"{t['eps'] / limit:.2f} ({name})",
                     _fmt(t["pg_cpu_s"], 1), _fmt(t.get("pg_cpu_us_per_event", float("nan")), 1),
                     _fmt(t.get("wal_bytes_per_event", float("nan")), 0),
                     _fmt(t.get("rows_written_per_event", float("nan")), 2),
                     _fmt(t["relay_cpu_s"], 1), _fmt(t["relay_peak_rss_mb"], 0),
                     _fmt(t.get("foreign_cpu_s", float("nan")), 1)])
    return _table(["mode", "events", "seconds", "events/s", "steady events/s", "ratio to limit",
                   "PG CPU s", "PG CPU µs/event", "extra WAL B/event", "rows written/event",
                   "relay CPU s", "relay peak RSS MB", "other procs CPU s"], rows)


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
        rows.append([mode, e["rate_eps"], _fmt(e["p50_ms"], 2), _fmt(e["p95_ms"], 2),
                     _fmt(e["p99_ms"], 2), _fmt(e["max_ms"], 2),
                     "" if "producer_linger_ms" in e else _fmt(over, 2), e.get("samples", 0),
                     e.get("missing", 0), e.get("duplicates", 0),
                     _fmt(e.get("foreign_cpu_s", float("nan")), 1)])
    return _table(["mode", "rate events/s", "p50 ms", "p95 ms", "p99 ms", "max ms",
                   "p50 over floor ms", "samples", "missing", "duplicates", "other procs CPU s"],
                  rows)


def limits_table(results: Results) -> str:
    """The limits table (markdown)."""
    limits = results["limits"]
    nan = float("nan")
    rows = [[f"pg_recvlogical {p}", _fmt(limits[f"pg_recvlogical_{p}_eps"], 0),
             _fmt(limits.get(f"pg_recvlogical_{p}_pg_cpu_s", nan), 2),
             _fmt(limits.get(f"pg_recvlogical_{p}_foreign_cpu_s", nan), 1)]
            for p in ("wal2json", "pgoutput") if f"pg_recvlogical_{p}_eps" in limits]
    rows.append(["bare idempotent producer", _fmt(limits["producer_eps"], 0), "-",
                 _fmt(limits.get("producer_foreign_cpu_s", nan), 1)])
    return _table(["limit", "events/s", "PG CPU s", "other procs CPU s"], rows)


def targets(results: Results) -> list[str]:
    """The issue's targets, checked against this run (reported, never asserted)."""
    lines = []
    limits = results["limits"]
    floor = min(float(limits["pg_recvlogical_eps"]), float(limits["producer_eps"]))
    for t in results["throughput"]:
        if t["mode"] == "wal-wal2json":
            ratio = t["eps"] / floor
            lines.append(f"- wal-wal2json backlog throughput {t['eps']:,.0f}/s = {ratio:.2f} x "
                         f"min(limits) {floor:,.0f}/s (target ≥ 0.6): "
                         f"{'met' if ratio >= 0.6 else 'NOT met'}")
    for e in results["latency"]:
        if e["mode"] == "wal-wal2json" and e["rate_eps"] == 1000:
            lines.append(f"- wal-wal2json p50 at 1,000 events/s: {e['p50_ms']:.2f} ms (target ≤ 10 ms): "
                         f"{'met' if e['p50_ms'] <= 10 else 'NOT met'}")
    return lines


def markdown(results: Results) -> str:
    """report.md."""
    m = results["machine"]
    out = [f"# cdc-relay benchmark ({results['plan']['label']} run, {results['started_at']})", "",
           f"Command: `{results['command']}`  ", f"Duration: {results['wall_seconds']:.0f} s; "
           f"load average at start {results['load_start']}, at end {results['load_end']}.  ",
           f"Other processes on the machine used {results.get('foreign_cpu_s', float('nan')):.1f} "
           "CPU seconds during the run (the *other procs CPU s* columns: per measurement; "
           "a few tenths is the machine's idle background, more means the figure was disturbed).",
           "",
           "## Machine", "",
           _table(["", ""], [[k.replace("_", " "), str(v)] for k, v in m.items()]), "",
           "## Limits", "", limits_table(results), "",
           "## Backlog throughput", "",
           f"{results['plan']['events']:,} events preloaded in transactions of 100 "
           "(~200 B payloads); seconds = relay spawn → consumer holds every event. "
           "ratio to limit: events/s over the mode's limit (see README).", "",
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
    limits = results["limits"]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    modes = [t["mode"] for t in results["throughput"]]
    ax.bar(modes, [t.get("steady_eps", 0) for t in results["throughput"]], color="#c6dbef",
           label="steady (first → last receipt)")
    ax.bar(modes, [t["eps"] for t in results["throughput"]], color="#3182bd", width=0.6,
           label="overall (spawn → last receipt)")
    lines = [("pg_recvlogical_wal2json_eps", "pg_recvlogical wal2json", "tab:red"),
             ("pg_recvlogical_pgoutput_eps", "pg_recvlogical pgoutput", "tab:orange"),
             ("producer_eps", "bare producer", "tab:green")]
    for key, label, color in lines:
        if key in limits:
            ax.axhline(limits[key], color=color, linestyle="--", label=f"{label} {limits[key]:,.0f}/s")
    ax.set(ylabel="events/s", title=f"Backlog throughput ({results['plan']['events']:,} events)")
    ax.legend(fontsize="small")
    ax.tick_params(axis="x", labelrotation=15)
    return _save(fig, out, "throughput.png")


def _cost_plot(results: Results, out: Path) -> str:
    rows = results["throughput"]
    modes = [t["mode"] for t in rows]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for ax, key, title in ((axes[0], "pg_cpu_us_per_event", "PostgreSQL CPU µs / event"),
                           (axes[1], "wal_bytes_per_event", "extra WAL bytes / event"),
                           (axes[2], "relay_cpu_us_per_event", "relay CPU µs / event")):
        ax.bar(modes, [t.get(key, 0) for t in rows], color="#756bb1")
        ax.set_title(title)
        ax.tick_params(axis="x", labelrotation=30)
    return _save(fig, out, "cost_per_event.png")


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
