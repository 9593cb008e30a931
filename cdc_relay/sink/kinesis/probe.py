"""Doctor's look at the Kinesis sink: the endpoint answers, the credentials work, the streams exist.

Reads only (DescribeStreamSummary, ListStreams): the dead-letter stream must exist and be
ACTIVE (FAIL otherwise); the streams of ``--topic-pattern`` are found with ListStreams
by the pattern's literal prefix (a WARN when none exists yet, or when ListStreams is not
granted - the relay itself does not need it). Must not: create or change anything.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from cdc_relay.errors import ConfigError, mask_secrets
from cdc_relay.sink.config import SinkProbe
from cdc_relay.sink.kinesis.client import IAM_FIX, MISSING, error_code, make_client, refusal
from cdc_relay.sink.kinesis.config import KinesisConfig


def _stream_probe(client: Any, name: str, role: str) -> SinkProbe:
    summary = client.describe_stream_summary(StreamName=name)["StreamDescriptionSummary"]
    status, shards = summary.get("StreamStatus", "?"), summary.get("OpenShardCount", "?")
    ok = status in ("ACTIVE", "UPDATING")
    return SinkProbe(role, ok, f"stream {name!r} is {status}, {shards} open shard(s), "
                     f"encryption {summary.get('EncryptionType', 'NONE')}",
                     None if ok else f"wait until {name!r} is ACTIVE")


def probe_kinesis(config: KinesisConfig, timeout: float) -> list[SinkProbe]:
    """Doctor: the endpoint answers, the credentials work, the streams exist. Changes nothing."""
    where = config.where
    try:
        client = make_client(replace(config, connect_timeout=min(config.connect_timeout, timeout),
                                     read_timeout=min(config.read_timeout, timeout)))
        dead = _stream_probe(client, config.dead_letter_stream, "dead-letter stream")
    except ConfigError as exc:
        return [SinkProbe("kinesis", False, str(exc), "give the region")]
    except Exception as exc:
        refused = refusal(exc, where)
        if refused is not None:
            return [SinkProbe("kinesis", False, str(refused), IAM_FIX)]
        if error_code(exc) not in MISSING:
            return [SinkProbe("kinesis", False, f"cannot reach Kinesis at {where}: "
                              f"{mask_secrets(str(exc) or type(exc).__name__)}",
                              "check --brokers and that the endpoint answers")]
        name = config.dead_letter_stream
        dead = SinkProbe("dead-letter stream", False, f"stream {name!r} does not exist",
                         f"create it: aws kinesis create-stream --stream-name {name} "
                         "--stream-mode-details StreamMode=ON_DEMAND")
    return [SinkProbe("kinesis", True, f"Kinesis at {where} answered"), dead,
            *_pattern_probes(client, config)]


def _pattern_probes(client: Any, config: KinesisConfig) -> list[SinkProbe]:
    pattern = config.topic_pattern
    try:
        pages = client.get_paginator("list_streams").paginate(PaginationConfig={"MaxItems": 1000})
        names = [name for page in pages for name in page.get("StreamNames", [])]
    except Exception as exc:
        return [SinkProbe("streams", None, f"cannot list streams ({error_code(exc) or exc}): the "
                          f"streams of {pattern!r} were not checked",
                          "grant kinesis:ListStreams to let doctor check them (the relay does "
                          "not need it)")]
    parts = re.split(r"\{[a-z_]+\}", pattern)
    regex = re.compile("[A-Za-z0-9_.-]+".join(re.escape(p) for p in parts))
    found = sorted(n for n in names if regex.fullmatch(n))[:20]
    if not found:
        return [SinkProbe("streams", None, f"no stream matches {pattern!r}: events wait (retried, "
                          "never dead-lettered) until their stream exists",
                          "create a stream per aggregate type, e.g. "
                          + pattern.replace("{aggregate_type}", "order"))]
    return [_stream_probe(client, name, "stream") for name in found]
