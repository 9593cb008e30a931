"""The classic polling relay, as the outbox articles write it: the benchmarks' baseline.

**Not the product.** This is the textbook algorithm, kept here only so that every run
shows how ``cdc-relay poll`` compares with it on the same machine:

1. ``BEGIN``; ``SELECT … WHERE processed_at IS NULL ORDER BY created_at LIMIT 100
   FOR UPDATE SKIP LOCKED`` (using its own partial index ``(created_at) WHERE
   processed_at IS NULL``, created on start);
2. produce every row, then wait for all acks (one flush per batch);
3. one ``UPDATE … SET processed_at = now() WHERE id = $1`` per row; ``COMMIT``;
4. when a batch comes back empty, sleep 1 s.

No retries, attempts, backoff, dead letters or wake-up: a failed delivery aborts the
batch (rolled back, claimed again). Producer settings are the relay's defaults
(``acks=all``, idempotence, ``linger.ms=5``) so the broker side is the same.

Run as ``python -m benchmarks.classic --dsn DSN --brokers HOST:PORT --topic-pattern P``;
SIGTERM/SIGINT stop it after the current batch. Must not: be used outside benchmarks/.
"""

from __future__ import annotations

import signal
import sys
import time
from types import FrameType
from typing import Any

import click
import psycopg
from confluent_kafka import Producer

BATCH = 100
IDLE_SLEEP = 1.0
TABLE = "public.outbox_events"
_INDEX = ("CREATE INDEX IF NOT EXISTS classic_relay_pending ON public.outbox_events (created_at) "
          "WHERE processed_at IS NULL")
_CLAIM = (f"SELECT id, aggregate_type, aggregate_id, event_type, payload::text, created_at "
          f"FROM {TABLE} WHERE processed_at IS NULL ORDER BY created_at LIMIT {BATCH} "
          "FOR UPDATE SKIP LOCKED")
_MARK = f"UPDATE {TABLE} SET processed_at = now() WHERE id = %s"

_stopping = False


def _stop(_signum: int, _frame: FrameType | None) -> None:
    global _stopping
    _stopping = True


def _publish(producer: Producer, rows: list[tuple[Any, ...]], pattern: str) -> None:
    """Produce a batch and wait for every ack; RuntimeError if one failed."""
    failures: list[str] = []

    def report(err: Any, _msg: Any) -> None:
        if err is not None:
            failures.append(str(err))

    for event_id, aggregate_type, aggregate_id, event_type, payload, created_at in rows:
        producer.produce(pattern.format(aggregate_type=aggregate_type), key=aggregate_id.encode(),
                         value=payload.encode(), on_delivery=report,
                         timestamp=int(created_at.timestamp() * 1000),
                         headers=[("id", str(event_id).encode()), ("event_type", event_type.encode()),
                                  ("aggregate_type", aggregate_type.encode())])
    producer.flush()
    if failures:
        raise RuntimeError(f"{len(failures)} deliveries failed, first: {failures[0]}")


def relay(dsn: str, brokers: str, pattern: str) -> None:
    """The loop: claim, publish, mark row by row, commit; sleep when idle."""
    producer = Producer({"bootstrap.servers": brokers, "acks": "all", "enable.idempotence": True,
                         "linger.ms": 5})
    with psycopg.connect(dsn) as conn:
        conn.execute(_INDEX)
        conn.commit()
        while not _stopping:
            rows = conn.execute(_CLAIM).fetchall()
            if not rows:
                conn.commit()
                time.sleep(IDLE_SLEEP)
                continue
            try:
                _publish(producer, rows, pattern)
            except RuntimeError as exc:
                conn.rollback()
                print(f"classic relay: batch failed, retrying: {exc}", file=sys.stderr)
                continue
            for row in rows:
                conn.execute(_MARK, (row[0],))
            conn.commit()


@click.command()
@click.option("--dsn", required=True)
@click.option("--brokers", required=True)
@click.option("--topic-pattern", default="outbox.event.{aggregate_type}")
def main(dsn: str, brokers: str, topic_pattern: str) -> None:
    """The classic outbox polling relay (benchmark baseline only)."""
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    relay(dsn, brokers, topic_pattern)


if __name__ == "__main__":
    main()
