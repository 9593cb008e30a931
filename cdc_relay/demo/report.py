"""What the demo shows: the live progress line and the final summary.

Owns the numbers a person watching the demo sees - throughput, nearest-rank p50/p99
latency over a recent window, and the summary (written, received, duplicates, lost, out
of order) - computed from the ``Book`` that cdc_relay.demo.traffic fills.

Must not write, consume or start anything, nor print: it returns strings and values,
and cdc_relay.app.demo decides where they go.
"""

from __future__ import annotations

from dataclasses import dataclass

from cdc_relay.demo.traffic import Book


def percentile(values: list[float], fraction: float) -> float:
    """Nearest-rank percentile of ``values`` (NaN when empty)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(fraction * len(ordered) + 0.5) - 1))]


@dataclass(frozen=True, slots=True)
class DemoSummary:
    """The demo's result; ``ok`` when nothing was lost."""

    written: int
    received: int
    duplicates: int
    lost: int
    out_of_order: int
    p50_ms: float
    p99_ms: float
    seconds: float

    @property
    def ok(self) -> bool:
        return self.lost == 0

    def __str__(self) -> str:
        return "\n".join([
            "summary:",
            f"  events written   {self.written:,}",
            f"  events received  {self.received:,}",
            f"  duplicates       {self.duplicates:,}",
            f"  lost             {self.lost:,}",
            f"  out of order     {self.out_of_order:,} (per order: placed → paid → shipped)",
            f"  latency          p50 {self.p50_ms:.1f} ms, p99 {self.p99_ms:.1f} ms "
            "(commit → consumer receipt)",
            f"  duration         {self.seconds:.1f} s",
        ])


def status_line(book: Book, written: int, events: int, elapsed: float) -> str:
    """The live progress line: written, received, rate, recent p50/p99, elapsed."""
    window = book.latencies_ms[-5_000:]
    received = len(book.receipts)
    latency = (f"p50 {percentile(window, 0.5):.1f} ms  p99 {percentile(window, 0.99):.1f} ms"
               if window else "p50 -  p99 -")
    return (f"  written {written:,}/{events:,}  received {received:,}  "
            f"{received / max(elapsed, 1e-3):,.0f} events/s  {latency}  {elapsed:.0f} s")


def summarize(book: Book, written: int, seconds: float) -> DemoSummary:
    """The summary of a run that wrote ``written`` events in ``seconds``."""
    latencies = book.latencies_ms[:]
    return DemoSummary(written=written, received=len(book.receipts),
                       duplicates=book.duplicates, lost=written - book.paired,
                       out_of_order=book.out_of_order,
                       p50_ms=percentile(latencies, 0.50), p99_ms=percentile(latencies, 0.99),
                       seconds=seconds)
