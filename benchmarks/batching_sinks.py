"""The Redis, HTTP and Kinesis side of the benchmark: the run's own receiver, and counting consumers.

wal-redis starts a throwaway redis-server (cdc_relay.local.message_brokers.RedisServer);
wal-kinesis a moto server of its own (cdc_relay.local.moto_server) with the run's streams;
wal-http a counting HTTP receiver of the run's own, in the counter's child process on a
port picked here. Each ``count_process_*`` runs in a spawned child like
``kafka_side.count_process`` and stamps the same shared values: the first receipt and the
``expected``-th distinct event id (replays are not counted twice). Only backlog
throughput is measured for these modes; moto bounds wal-kinesis (moto is no measure of
Kinesis), so it runs only when named, as wal-sqs.

Must not: touch PostgreSQL.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Event
from typing import Any

import orjson

from cdc_relay.local.helpers import HOST, free_port
from cdc_relay.local.message_brokers import RedisServer
from cdc_relay.local.moto_server import MOTO_ENV, MotoServer


def _stamp(seen: set[Any], fresh: list[Any], expected: int, received: Synchronized[int],
           first_at: Synchronized[float], done_at: Synchronized[float]) -> None:
    now = time.time()
    if not seen and fresh:
        first_at.value = now
    seen.update(fresh)
    received.value = len(seen)
    if len(seen) >= expected and not done_at.value:
        done_at.value = now


@contextmanager
def redis_side(topics: list[str]) -> Iterator[tuple[str, tuple[str, ...], Any, Any]]:
    """A redis-server of the run's own; the streams are the topics."""
    with RedisServer() as server:
        yield (server.url, ("--sink", "redis"), count_process_redis,
               lambda topic: (server.url, topic))


def count_process_redis(url: str, stream: str, expected: int, received: Synchronized[int],
                        first_at: Synchronized[float], done_at: Synchronized[float],
                        ready: Event, stop: Event) -> None:
    """Child: count distinct ``id`` fields of the entries XADDed to ``stream``."""
    import redis

    client: Any = redis.Redis.from_url(url)
    seen: set[bytes] = set()
    last = b"0-0"
    ready.set()
    while not stop.is_set():
        reply = client.xread({stream: last}, count=10_000, block=100)
        for _, entries in reply or []:
            if entries:
                last = entries[-1][0]
                _stamp(seen, [fields.get(b"id") for _, fields in entries], expected, received,
                       first_at, done_at)
    client.close()


@contextmanager
def http_side(topics: list[str]) -> Iterator[tuple[str, tuple[str, ...], Any, Any]]:
    """A port for the counter's HTTP receiver; the relay posts to ``/{topic}`` there."""
    port = free_port()
    yield (f"http://{HOST}:{port}/{{topic}}", ("--sink", "http", "--sink-config", "concurrency=8",
                                              "--sink-config", "max_per_host=8"),
           count_process_http, lambda topic: (port,))


def count_process_http(port: int, expected: int, received: Synchronized[int],
                       first_at: Synchronized[float], done_at: Synchronized[float],
                       ready: Event, stop: Event) -> None:
    """Child: an HTTP receiver on ``port`` answering 200, counting distinct ``Idempotency-Key``\\ s."""
    lock = threading.Lock()
    batch: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            with lock:
                batch.append(self.headers.get("Idempotency-Key", ""))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

    server = ThreadingHTTPServer((HOST, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    seen: set[str] = set()
    ready.set()
    while not stop.wait(0.01):
        with lock:
            fresh, batch[:] = list(batch), []
        if fresh:
            _stamp(seen, fresh, expected, received, first_at, done_at)
    server.shutdown()
    server.server_close()


@contextmanager
def kinesis_side(topics: list[str]) -> Iterator[tuple[str, tuple[str, ...], Any, Any]]:
    """A moto server with a one-shard stream per topic and the dead letters'."""
    import boto3

    saved = {key: os.environ.get(key) for key in MOTO_ENV}
    os.environ.update(MOTO_ENV)  # for the relay and the counter, children of this process
    try:
        with MotoServer() as server:
            client = boto3.client("kinesis", endpoint_url=server.url)
            for stream in [*topics, "bench.dlq"]:
                client.create_stream(StreamName=stream, ShardCount=1)
            yield (server.url, ("--sink", "kinesis", "--message-timeout", "5m",
                                "--sink-config", "read_timeout=60"),
                   count_process_kinesis, lambda topic: (server.url, topic))
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def count_process_kinesis(url: str, stream: str, expected: int, received: Synchronized[int],
                          first_at: Synchronized[float], done_at: Synchronized[float],
                          ready: Event, stop: Event) -> None:
    """Child: count distinct event ids in the envelopes of ``stream``'s one shard."""
    import boto3

    client = boto3.client("kinesis", endpoint_url=url, region_name=MOTO_ENV["AWS_REGION"])
    shard = client.list_shards(StreamName=stream)["Shards"][0]["ShardId"]
    iterator = client.get_shard_iterator(StreamName=stream, ShardId=shard,
                                         ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
    seen: set[str] = set()
    ready.set()
    while not stop.is_set() and iterator:
        reply = client.get_records(ShardIterator=iterator, Limit=10_000)
        iterator = reply.get("NextShardIterator")
        ids = [orjson.loads(r["Data"])["headers"].get("id") for r in reply["Records"]]
        if ids:
            _stamp(seen, ids, expected, received, first_at, done_at)
        else:
            stop.wait(0.1)
