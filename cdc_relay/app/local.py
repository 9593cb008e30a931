"""``cdc-relay local kafka|sqs``: one throwaway broker in the foreground, for a first run by hand.

Owns starting one local service (cdc_relay.local: the Tansu broker for Kafka, moto's
server for SQS), printing what a user passes to the relay (``--brokers``, and for SQS the
AWS settings and the queues to create), and stopping it on Ctrl-C or SIGTERM, or
reporting that it died. Both keep everything in memory: stopping one loses every topic
or queue (docs/getting-started.md).

Must not: start PostgreSQL or the relay (``cdc-relay demo`` runs the whole pipeline),
create topics or queues, or return while the service it started still runs.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Protocol

from cdc_relay.errors import LocalServiceError

# What boto3 and the aws CLI need to talk to moto: any key is accepted, the region names
# moto's backend.
SQS_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_REGION": "us-east-1", "AWS_DEFAULT_REGION": "us-east-1"}


class _Service(Protocol):
    def wait(self) -> int | None: ...


def serve_kafka(port: int | None, echo: Callable[[str], None]) -> None:
    """Run a memory-only Tansu broker on 127.0.0.1 until Ctrl-C or SIGTERM."""
    from cdc_relay.local.broker import Broker

    with Broker(port=port) as broker:
        echo(f"Kafka-protocol broker (Tansu, memory only) on {broker.bootstrap}; "
             "Ctrl-C stops it and loses every topic")
        echo(f"  cdc-relay run --dsn \"$DSN\" --brokers {broker.bootstrap}")
        echo("  topics: outbox.event.<aggregate_type> (e.g. outbox.event.order), "
             "created on first use")
        until_stopped(broker, "the Tansu broker", echo)
        broker.stop()


def serve_sqs(port: int | None, echo: Callable[[str], None]) -> None:
    """Run moto's SQS server on 127.0.0.1 until Ctrl-C or SIGTERM."""
    from cdc_relay.local.moto_server import MotoServer

    server = MotoServer(port=port).start()
    try:
        url = server.url
        echo(f"SQS endpoint (moto, memory only) at {url}; Ctrl-C stops it and loses "
             "every queue")
        echo("  export " + " ".join(f"{k}={v}" for k, v in SQS_ENV.items()))
        for queue in ("outbox-event-order.fifo", "outbox-dead-letters.fifo"):
            echo(f"  aws --endpoint-url {url} sqs create-queue --queue-name {queue} "
                 "--attributes FifoQueue=true")
        echo(f"  cdc-relay run --dsn \"$DSN\" --sink sqs --brokers {url}")
        until_stopped(server, "moto_server", echo)
    finally:
        server.stop()


def until_stopped(service: _Service, name: str, echo: Callable[[str], None]) -> None:
    """Return on Ctrl-C or SIGTERM; raise LocalServiceError if the service exits first."""
    stop = threading.Event()
    exited: list[int | None] = []

    def watch() -> None:
        exited.append(service.wait())
        stop.set()

    threading.Thread(target=watch, name="local-service-watch", daemon=True).start()
    with _stop_on_signals(stop):
        stop.wait()
    if exited:
        raise LocalServiceError(f"{name} exited (status {exited[0]})")
    echo(f"stopping {name}")


@contextlib.contextmanager
def _stop_on_signals(stop: threading.Event) -> Iterator[None]:
    """SIGINT and SIGTERM set ``stop`` (each time): the caller stops what it started.

    Installed explicitly: a shell starts background jobs with SIGINT ignored.
    """
    def handler(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, action in previous.items():
            signal.signal(sig, action)
