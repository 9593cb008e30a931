"""A throwaway Kafka-protocol broker with real transaction semantics (noida-db) for tests.

Owns how ``noida-db start --only kafka`` is started on a free 127.0.0.1 port with a data
dir of its own, stopped and restarted; the process handling every local broker shares
(readiness, kill, pause/resume, cleanup) is cdc_relay.local.kafka_process. Unlike the
Tansu broker (cdc_relay.local.broker) it hides aborted transactions from
``read_committed`` consumers and fences zombie producers, so the exactly-once tests run
on it (docs/design.md, test services). It persists to one JSON file in its data dir:
``restart()`` keeps topics and transaction state, SIGKILL may lose the latest writes,
SIGINT stops it promptly (SIGTERM may wait).

Must not: touch a broker it did not start, or import the relay's drivers.
"""

from __future__ import annotations

import importlib.util
import os
import signal
from pathlib import Path

from cdc_relay.errors import LocalServiceError
from cdc_relay.local.helpers import clean_env
from cdc_relay.local.kafka_process import KafkaProcess


def noida_binary(package: str = "noida_db") -> Path:
    """The noida-db server binary shipped inside the ``noida-db`` wheel."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise LocalServiceError("noida-db is not installed: pip install 'cdc-relay[test]'")
    binary = Path(next(iter(spec.submodule_search_locations))) / "noida-db"
    if not binary.is_file():
        raise LocalServiceError(f"the noida-db binary is missing at {binary}: "
                                "pip install --force-reinstall noida-db")
    if not os.access(binary, os.X_OK):
        binary.chmod(0o755)  # the wheel's own launcher does the same
    return binary


class NoidaBroker(KafkaProcess):
    """noida-db's Kafka service on 127.0.0.1, its data in a temp dir of its own."""

    name = "noida-db"
    log_name = "noida.log"
    tmp_prefix = "cdc-relay-noida-"

    def _command(self, tmp: Path, port: int) -> tuple[list[str], dict[str, str]]:
        return ([str(noida_binary()), "start", "--data-dir", str(tmp / "data"), "--host", self.host,
                 "--only", "kafka", "--kafka-port", str(port)], clean_env())

    def stop(self, timeout: float = 10.0) -> None:
        """SIGINT (saves its data and exits promptly), then SIGKILL after ``timeout`` s."""
        self._stop_with(signal.SIGINT, timeout)

    def restart(self) -> None:
        """Stop cleanly and start again on the same port and data dir (topics survive)."""
        self.stop()
        self.start()
