"""Shared pieces of the Kinesis sink tests: a reader of the test's own streams on moto's server.

Every test creates its streams (``{prefix}.{aggregate_type}``, two shards each, and
``{prefix}.dlq``) and deletes them. Records are read from every shard from the start each
time (moto keeps them all) and turned into ``tests.support.Msg`` from their envelope, so
that ``wal_support.assert_contract`` checks them as it checks Kafka records: the stream is
the topic, the shard the partition, the place in the shard the offset.
"""

from __future__ import annotations

from contextlib import suppress
from typing import Any

import boto3
import orjson

from tests.support import Msg


def kinesis_args(prefix: str, *extra: str) -> tuple[str, ...]:
    return ("--sink", "kinesis", "--topic-pattern", f"{prefix}.{{aggregate_type}}",
            "--dead-letter-topic", f"{prefix}.dlq", *extra)


class KinesisReader:
    def __init__(self, url: str, prefix: str) -> None:
        self.url, self.prefix = url, prefix
        self.client: Any = boto3.client("kinesis", endpoint_url=url)

    def create(self, *names: str, shards: int = 2) -> None:
        for name in names:
            self.client.create_stream(StreamName=f"{self.prefix}.{name}", ShardCount=shards)

    def stream(self, name: str) -> list[Msg]:
        """Every record of ``{prefix}.{name}``, shard by shard, in order."""
        stream = f"{self.prefix}.{name}"
        out: list[Msg] = []
        try:
            shards = self.client.list_shards(StreamName=stream)["Shards"]
        except self.client.exceptions.ResourceNotFoundException:
            return []
        for number, shard in enumerate(shards):
            iterator = self.client.get_shard_iterator(
                StreamName=stream, ShardId=shard["ShardId"],
                ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
            offset = 0
            while iterator:
                reply = self.client.get_records(ShardIterator=iterator, Limit=10_000)
                for record in reply["Records"]:
                    out.append(to_msg(stream, number, offset, record))
                    offset += 1
                if not reply["Records"]:
                    break
                iterator = reply.get("NextShardIterator")
        return out

    def close(self) -> None:
        with suppress(Exception):
            for name in self.client.list_streams()["StreamNames"]:
                if name.startswith(self.prefix + "."):
                    with suppress(Exception):
                        self.client.delete_stream(StreamName=name)


def to_msg(stream: str, shard: int, offset: int, record: dict[str, Any]) -> Msg:
    envelope = orjson.loads(record["Data"])
    headers = {k: v.encode() for k, v in envelope["headers"].items()}
    headers["_PartitionKey"] = record["PartitionKey"].encode()
    payload = envelope["payload"]
    return Msg(topic=stream, partition=shard, offset=offset, key=envelope["key"].encode(),
               value=None if payload is None else orjson.dumps(payload), headers=headers,
               timestamp=envelope["timestamp"] or 0)
