"""Differential fuzz of every compiled extension against its pure twin (docs/design.md, "The
compiled paths"; ``make sanitize`` runs it on the ASan + UBSan build).

    python -m tests.fuzz.fuzz [--seconds 20] [--seed 1] [--findings DIR] [TARGET ...]

Each target runs for a bounded time from a fixed seed (``random.Random(seed)``: the same
seed replays the same inputs, in the same order), feeding both paths the same inputs and
requiring the same outcome - the same value, or the same exception type and text:
mutated fixture streams for the decoders (truncations, flipped, inserted and removed
bytes) decoded as streams that go on after an error, each message handed over as an
exact-size buffer (a ctypes array: ASan sees a read one byte past it) and as a view into
a larger one, and rows with odd created_at texts (the decoders' C timestamp parse); odd
texts for the router; random report sequences
for the delivery reports; scripted libpq answers for the replication reader. A mismatch is
saved under ``--findings`` (its target, seed, iteration and inputs, as JSON) and makes the
exit status 1; a crash is the sanitizer's report and a non-zero status.

Must not: depend on a service, or on the wall clock for anything but when to stop.
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import json
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cdc_relay import accel
from cdc_relay.config import RouterConfig
from cdc_relay.decoding.pgoutput import PgOutputDecoder
from cdc_relay.decoding.wal2json import Wal2JsonDecoder
from cdc_relay.model import OutboxColumns, OutboxEvent
from cdc_relay.routing import Router
from cdc_relay.sink.kafka.sink import Reports
from cdc_relay.wal.stream.replication import ReplicationStream
from tests.unit.decoding_fixtures import AT, OUTBOX, load
from tests.unit.test_decoding_timestamps import pgoutput_rows, wal2json_rows

Inputs = list[Any]


class Mismatch(Exception):
    """The two paths disagreed on one input."""


def outcome(call: Callable[[], Any]) -> tuple[str, Any]:
    """What ``call`` returns, or its exception's type and text."""
    try:
        return ("value", call())
    except Exception as exc:  # the pure path's own behaviour, whatever it is, must match
        return (type(exc).__name__, str(exc))


def mutate(rnd: random.Random, data: bytes) -> bytes:
    """``data`` truncated, or with a few bytes flipped, inserted or removed."""
    out = bytearray(data)
    for _ in range(rnd.choice((1, 1, 2, 3))):
        kind = rnd.randrange(4)
        at = rnd.randrange(len(out) + 1)
        if kind == 0:
            del out[at:]
        elif kind == 1 and out:
            out[min(at, len(out) - 1)] = rnd.randrange(256)
        elif kind == 2:
            out[at:at] = bytes([rnd.choice((0, 34, 92, 123, 125, 0xC3, 0xFF, rnd.randrange(256)))])
        elif out:
            del out[min(at, len(out) - 1)]
    return bytes(out)


def exact(data: bytes) -> memoryview:
    """``data`` in a buffer of exactly its size (ASan: one byte past it is a report)."""
    if not data:
        return memoryview(b"")
    array = (ctypes.c_char * len(data)).from_buffer_copy(data)
    return memoryview(array).cast("B")


def spans(rnd: random.Random, data: bytes) -> memoryview:
    """``data`` as a view into a larger buffer (bytes after it that must not be read)."""
    return memoryview(data + bytes(rnd.randrange(1, 9)) + b"}\"")[: len(data)]


def stream_inputs(rnd: random.Random, messages: list[bytes]) -> Inputs:
    """A fixture stream's prefix with some messages mutated (the stream goes on after each)."""
    end = rnd.randrange(1, len(messages) + 1)
    out = list(messages[:end])
    for _ in range(rnd.randrange(1, 4)):
        i = rnd.randrange(len(out))
        out[i] = mutate(rnd, out[i])
    return out


def compare_streams(make: Callable[[], Any], inputs: Inputs, rnd: random.Random) -> None:
    """Both decoders fed the same messages in order: the same outcome for each."""
    with accel.forced(True):
        pure = make()
    with accel.forced(False):
        fast = make()
    assert fast.compiled and not pure.compiled
    for message in inputs:
        wrapped = exact(message) if rnd.random() < 0.5 else spans(rnd, message)
        got = outcome(lambda: fast.decode(wrapped, AT))  # noqa: B023  # called at once
        want = outcome(lambda: pure.decode(message, AT))  # noqa: B023
        if got != want:
            raise Mismatch(f"{message!r}: compiled {got!r}, pure {want!r}")


@functools.cache
def fixture(name: str) -> list[bytes]:
    """A captured stream's messages (tests/fixtures)."""
    return [payload for _, payload in load(name)]


_TIMESTAMPS = ("2026-11-30 11:11:26.123456+00", "1999-12-31 23:59:59-05:30", "0001-01-01 00:00:00",
               "9999-12-31 23:59:59.999999+14:59:59", "2024-02-29 12:00:00.5+01", "infinity")


def created_at_texts(rnd: random.Random) -> list[str]:
    """A few created_at texts, mutated, some repeated (the decoders' C parse and its cache)."""
    texts = [mutate(rnd, rnd.choice(_TIMESTAMPS).encode()).decode("utf-8", "surrogateescape")
             for _ in range(rnd.randrange(1, 4))]
    return [rnd.choice(texts) for _ in range(rnd.randrange(1, 8))]


def wal2json(rnd: random.Random) -> Inputs:
    """A mutated captured stream, or rows whose created_at texts are odd."""
    inputs = (stream_inputs(rnd, fixture("wal2json_v2.jsonl")) if rnd.random() < 0.7
              else wal2json_rows(created_at_texts(rnd), rnd))
    extras = rnd.choice(((), ("aggregate_id",)))
    compare_streams(lambda: Wal2JsonDecoder(OUTBOX, OutboxColumns(), extra_columns=extras),
                    inputs, rnd)
    return inputs


def pgoutput(rnd: random.Random) -> Inputs:
    """A mutated captured stream, or rows whose created_at texts are odd."""
    inputs = (stream_inputs(rnd, fixture("pgoutput_v1.jsonl")) if rnd.random() < 0.7
              else pgoutput_rows(created_at_texts(rnd)))
    compare_streams(lambda: PgOutputDecoder(OUTBOX, OutboxColumns()), inputs, rnd)
    return inputs


def _text(rnd: random.Random) -> str:
    pool = "aZ09._-/ é\u2603\ud800\U0001F600"
    return "".join(rnd.choice(pool) for _ in range(rnd.randrange(0, 12)))


def route(rnd: random.Random) -> Inputs:
    pattern = rnd.choice(("outbox.{aggregate_type}", "{aggregate_type}.{event_type}", "x"))
    with accel.forced(True):
        pure = Router(RouterConfig(topic_pattern=pattern))
    with accel.forced(False):
        fast = Router(RouterConfig(topic_pattern=pattern))
    assert fast.compiled and not pure.compiled
    texts = [_text(rnd) for _ in range(4)]
    inputs: Inputs = []
    for _ in range(rnd.randrange(1, 6)):
        event = OutboxEvent(rnd.choice(texts), rnd.choice(texts[:2]), rnd.choice(texts),
                            rnd.choice(texts[:2]), bytes(rnd.randrange(256) for _ in range(4)),
                            rnd.choice((None, 0, 2**40)), AT,
                            traceparent=rnd.choice((None, None, "00-x")))
        inputs.append(repr(event))
        got, want = outcome(lambda: fast.route(event)), outcome(lambda: pure.route(event))  # noqa: B023
        if got != want:
            raise Mismatch(f"{event!r}: compiled {got!r}, pure {want!r}")
    return inputs


def reports(rnd: random.Random) -> Inputs:
    module = accel.extension("_creports")
    assert module is not None, "the compiled reports are not built"
    logs: dict[str, list[Any]] = {"pure": [], "fast": []}
    made = {}
    for name, cls in (("pure", Reports), ("fast", module.Reports)):
        log = logs[name]
        made[name] = cls(lambda t, e, log=log: log.append(("handler", t, e)),
                         lambda t, e, m, log=log: log.append(("failure", t, e, m)))
    steps: Inputs = []
    callbacks: dict[str, list[Any]] = {"pure": [], "fast": []}
    for _ in range(rnd.randrange(1, 30)):
        step = rnd.choice(("produce", "success", "failure", "batch", "hand_over", "unbatch"))
        steps.append(step)
        for name, r in made.items():
            log = logs[name]
            if step == "produce":
                callbacks[name].append(r.callback(len(callbacks[name])))
            elif step in ("success", "failure") and callbacks[name]:
                callback = callbacks[name].pop(0)
                log.append(outcome(lambda: callback(None if step == "success" else "err", "m")))  # noqa: B023
            elif step == "batch":
                log.append(outcome(lambda: setattr(r, "batch", log.append)))  # noqa: B023
            elif step == "unbatch":
                log.append(outcome(lambda: setattr(r, "batch", None)))  # noqa: B023
            elif step == "hand_over":
                r.hand_over()
            log.append(("delivered", r.delivered))
    if logs["pure"] != logs["fast"]:
        raise Mismatch(f"compiled {logs['fast']!r}, pure {logs['pure']!r}")
    return steps


class _Pgconn:
    def __init__(self, answers: Inputs) -> None:
        self.answers = list(answers)

    def get_copy_data(self, async_: int) -> tuple[int, Any]:
        if not self.answers:
            return 0, memoryview(b"")
        answer = self.answers.pop(0)
        return (answer, memoryview(b"")) if isinstance(answer, int) else (len(answer), exact(answer))


def stream(rnd: random.Random) -> Inputs:
    answers: Inputs = []
    for _ in range(rnd.randrange(1, 8)):
        position = rnd.choice((0, 1, 0x16B374D848, 2**64 - 1)).to_bytes(8, "big")
        header = position + bytes(16)
        choice = rnd.randrange(5)
        message = (b"w" + header + bytes(rnd.randrange(256) for _ in range(rnd.randrange(4)))
                   if choice < 2 else b"k" + position + bytes(9) if choice == 2 else
                   mutate(rnd, b"w" + header + b"row"))
        answers.append(message if choice < 4 else rnd.choice((0, -1, -2)))
    results = {}
    for compiled in (False, True):
        source = ReplicationStream.__new__(ReplicationStream)
        ReplicationStream.__init__(source, _stream_config(), [])
        source._pgconn = _Pgconn(answers)  # type: ignore[assignment]
        with accel.forced(not compiled):
            reader = source.changes(lambda payload, position: (bytes(payload), int(position)))
        results[compiled] = [outcome(reader) for _ in range(len(answers) + 1)]
    if results[True] != results[False]:
        raise Mismatch(f"{answers!r}: compiled {results[True]!r}, pure {results[False]!r}")
    return [a if isinstance(a, int) else a.hex() for a in answers]


def _stream_config() -> Any:
    from cdc_relay.config import ReplicationConfig

    return ReplicationConfig(dsn="host=127.0.0.1 dbname=x")


TARGETS: dict[str, Callable[[random.Random], Inputs]] = {
    "_cwal2json": wal2json, "_cpgoutput": pgoutput,
    "_croute": route, "_creports": reports, "_cstream": stream,
}


def run(name: str, seconds: float, seed: int, findings: Path) -> int:
    """Fuzz one target; the number of mismatches (each saved under ``findings``)."""
    rnd = random.Random(f"{name}:{seed}")
    deadline = time.monotonic() + seconds
    iterations = failures = 0
    while time.monotonic() < deadline:
        try:
            TARGETS[name](rnd)
        except Mismatch as exc:
            failures += 1
            findings.mkdir(parents=True, exist_ok=True)
            (findings / f"{name}-{seed}-{iterations}.json").write_text(json.dumps(
                {"target": name, "seed": seed, "iteration": iterations, "mismatch": str(exc)},
                indent=2, default=repr) + "\n")
        iterations += 1
    print(f"fuzz {name}: {iterations} inputs in {seconds:.0f} s (seed {seed}), "
          f"{failures} mismatches", flush=True)
    return failures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("targets", nargs="*", metavar="TARGET",
                        help=f"some of {', '.join(sorted(TARGETS))} (default: all)")
    parser.add_argument("--seconds", type=float, default=20.0, help="per target")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--findings", type=Path, default=Path("build/fuzz-findings"))
    args = parser.parse_args()
    targets = args.targets or sorted(TARGETS)
    unknown = sorted(set(targets) - set(TARGETS))
    if unknown:
        raise SystemExit(f"fuzz: unknown target {', '.join(unknown)}")
    missing = sorted(set(targets) - accel.built())
    if missing:
        raise SystemExit(f"fuzz: not built: {', '.join(missing)}")
    failures = sum(run(name, args.seconds, args.seed, args.findings) for name in targets)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
