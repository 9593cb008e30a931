"""``cdc-relay local kafka|sqs``: a throwaway broker in the foreground, as a user starts it by
hand for a first run (docs/getting-started.md): it prints what the relay needs, takes
events there, and Ctrl-C or SIGTERM stops it, leaving nothing listening."""

from __future__ import annotations

import re
import signal
import urllib.request

import boto3
from confluent_kafka import Producer

from cdc_relay.local.helpers import kafka_api_versions_ok
from tests.support import CliProcess, wait_for


def printed(server: CliProcess, pattern: str) -> re.Match[str]:
    """The first match of ``pattern`` in the command's output, once it is there."""
    wait_for(lambda: re.search(pattern, server.stdout) is not None or not server.running(),
             timeout=60, message=f"the command printing {pattern!r}")
    found = re.search(pattern, server.stdout)
    assert found is not None, server.stdout + server.stderr
    return found


def test_local_kafka_prints_the_brokers_address_takes_events_there_and_ctrl_c_stops_it() -> None:
    with CliProcess(["local", "kafka"]) as server:
        host, port = printed(server, r"--brokers (127\.0\.0\.1):(\d+)").groups()
        assert "outbox.event.order" in server.stdout
        producer = Producer({"bootstrap.servers": f"{host}:{port}"})
        reports: list[object] = []
        producer.produce("outbox.event.order", b"{}", on_delivery=lambda e, _m: reports.append(e))
        assert producer.flush(30) == 0 and reports == [None]
        assert server.stop(signal.SIGINT) == 0, server.stderr
    assert "stopping the Tansu broker" in server.stdout
    assert not kafka_api_versions_ok(host, int(port))


def test_local_sqs_prints_the_endpoint_and_settings_takes_messages_and_sigterm_stops_it() -> None:
    with CliProcess(["local", "sqs"]) as server:
        url = printed(server, r"--brokers (http://127\.0\.0\.1:\d+)")[1]
        settings = dict(re.findall(r"(AWS_[A-Z_]+)=(\S+)", printed(server, r"export .*")[0]))
        client = boto3.client("sqs", endpoint_url=url, region_name=settings["AWS_REGION"],
                              aws_access_key_id=settings["AWS_ACCESS_KEY_ID"],
                              aws_secret_access_key=settings["AWS_SECRET_ACCESS_KEY"])
        queue = client.create_queue(QueueName="outbox-event-order.fifo",
                                    Attributes={"FifoQueue": "true"})["QueueUrl"]
        client.send_message(QueueUrl=queue, MessageBody="{}", MessageGroupId="o-1",
                            MessageDeduplicationId="e-1")
        assert server.stop(signal.SIGTERM) == 0, server.stderr
    assert "stopping moto_server" in server.stdout
    try:
        urllib.request.urlopen(f"{url}/moto-api/", timeout=2)
        answered = True
    except OSError:
        answered = False
    assert not answered
