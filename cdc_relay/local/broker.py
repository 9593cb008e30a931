"""A throwaway memory-only Kafka-protocol broker (Tansu) for tests, the demo and benchmarks.

Owns how Tansu is started (memory storage, its listener on a free 127.0.0.1 port), stopped
and restarted; the process handling every local broker shares (readiness, kill,
pause/resume, cleanup) is cdc_relay.local.kafka_process.

Must not: touch a broker it did not start, or import the relay's drivers (no
confluent_kafka here). PostgreSQL is cdc_relay.local.postgres.
"""

from __future__ import annotations

import signal
from pathlib import Path

from cdc_relay.local.helpers import clean_env, tansu_binary
from cdc_relay.local.kafka_process import KafkaProcess


class Broker(KafkaProcess):
    """A memory-only Tansu broker on 127.0.0.1: a restart loses every topic."""

    name = "the Tansu broker"
    log_name = "tansu.log"
    tmp_prefix = "cdc-relay-broker-"

    def _command(self, tmp: Path, port: int) -> tuple[list[str], dict[str, str]]:
        url = f"tcp://{self.host}:{port}"
        return ([str(tansu_binary()), "broker", "--listener-url", url, "--advertised-listener-url",
                 url, "--storage-engine", "memory://tansu/"], clean_env(RUST_LOG="warn"))

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 2 s (it waits ~5 s while clients are connected)."""
        if self._paused:  # a stopped process cannot act on SIGTERM: just kill it
            self.kill()
            return
        self._stop_with(signal.SIGTERM, 2.0)

    def restart(self) -> None:
        """Kill and start again on the same port: every topic and producer id is gone."""
        self.kill()
        self.start()
