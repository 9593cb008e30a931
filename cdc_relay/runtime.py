"""Process-wide settings of the ``cdc-relay`` process, above all of the commands that run
until stopped (``run``, ``poll``).

Owns one thing: how often CPython's cyclic garbage collector runs. The relays allocate a
few container objects per event (the event, its message and headers, the delivery
callback) that stay alive until the broker acknowledges the message - a few
milliseconds, up to the in-flight limit. With CPython's default thresholds (a young
collection every 700 net allocations) the collector runs every few dozen events, finds
the in-flight events alive, promotes them and traverses them again in the older
generations: ~8% of WAL mode's main-thread CPU in a profile of a 200k-event backlog,
and 10-25% of its throughput (docs/design.md, WAL mode's hot path). These objects form
no reference cycles - reference counting frees them as soon as the ack arrives - so
collecting less often costs no memory worth counting; the collector still runs and
still finds the rare cycle (an exception with its traceback), just less often.

The same thresholds also save start-up CPU: importing click, confluent-kafka and psycopg
allocates ~50,000 long-lived objects, ~80 young collections under the defaults (~10 ms).
So the process entry point (cli/entry.py) calls ``tune_gc`` before it imports the CLI,
for every command; ``run`` and ``poll`` call it again for a CLI invoked in process.

Must not disable the collector, and must not be called from library code: only the
entry point and the long-running commands call ``tune_gc``, so importing cdc_relay
changes nothing.
"""

from __future__ import annotations

import gc

# (young, middle, old): a young collection every 100,000 net allocations (~10,000
# events), the middle one every 50 of those, the full one every 100 middle ones (and
# only once a quarter of the long-lived objects is new: CPython's own rule).
GC_THRESHOLDS = (100_000, 50, 100)


def tune_gc() -> None:
    """Set the collector's thresholds for a relay process (see the module docstring)."""
    gc.set_threshold(*GC_THRESHOLDS)
