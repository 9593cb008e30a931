"""The machine's shared RabbitMQ and NATS: is it up, and start it if it is not.

Development and CI machines of this project run RabbitMQ (127.0.0.1:5672, guest/guest)
and NATS with JetStream (127.0.0.1:4222) as shared services; tests and benchmarks use
them with unique exchange, stream and subject names. When one is down, ``ensure_*``
starts it the way the machine is set up to (``rabbitmq-server -detached``; nats-server
with ``-js`` under start-stop-daemon) and waits for its port. Unlike the throwaway
PostgreSQL and Kafka brokers these are never stopped: other users share them.

Must not: stop or reconfigure a running service, or import a broker client.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time

from cdc_relay.errors import LocalServiceError

HOST = "127.0.0.1"
RABBITMQ_PORT = 5672
NATS_PORT = 4222
RABBITMQ_URL = f"amqp://guest:guest@{HOST}:{RABBITMQ_PORT}/%2F"
NATS_URL = f"nats://{HOST}:{NATS_PORT}"

_NATS_START = ["start-stop-daemon", "--start", "--oknodo", "--background", "--exec",
               "/usr/sbin/nats-server", "--", "-a", HOST, "-p", str(NATS_PORT), "-js", "-sd",
               "/var/lib/nats-server", "-l", "/var/log/nats-server.log"]


def listening(port: int, host: str = HOST, timeout: float = 0.5) -> bool:
    """Whether something accepts TCP connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _ensure(name: str, port: int, command: list[str], wait: float) -> None:
    if listening(port):
        return
    if shutil.which(command[0]) is None:
        raise LocalServiceError(f"{name} is not running on {HOST}:{port} and {command[0]} is not "
                                "installed")
    try:
        subprocess.run(command, check=True, capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        raise LocalServiceError(f"{name} is not running on {HOST}:{port} and "
                                f"'{' '.join(command)}' failed: {exc}") from exc
    deadline = time.monotonic() + wait
    while not listening(port):
        if time.monotonic() > deadline:
            raise LocalServiceError(f"{name} was started but {HOST}:{port} did not open within "
                                    f"{wait:g} s")
        time.sleep(0.2)


def ensure_rabbitmq(wait: float = 60.0) -> str:
    """The AMQP URL of the machine's RabbitMQ, started if it was not running."""
    _ensure("RabbitMQ", RABBITMQ_PORT, ["rabbitmq-server", "-detached"], wait)
    return RABBITMQ_URL


def ensure_nats(wait: float = 20.0) -> str:
    """The URL of the machine's NATS (JetStream on), started if it was not running."""
    _ensure("NATS", NATS_PORT, _NATS_START, wait)
    return NATS_URL
