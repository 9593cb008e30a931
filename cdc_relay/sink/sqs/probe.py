"""Doctor's look at the SQS sink: the endpoint answers, the credentials work, the queues exist.

Reads only (GetQueueUrl, GetQueueAttributes, ListQueues): the dead-letter queue must
exist (FAIL otherwise); the queues of ``--topic-pattern`` are found with ListQueues by
the pattern's literal prefix. Three WARNs, each with its own fix: no queue of the
pattern exists yet (an empty answer: name the queues ``run`` will need and the command
that creates them), ListQueues refused (grant it - the relay itself does not need it),
ListQueues failed otherwise. A standard queue is a WARN: it keeps no
order and drops no replay (docs/sinks.md). Must not: create or change anything.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from cdc_relay.errors import ConfigError, ExitCode, mask_secrets
from cdc_relay.sink.config import SinkProbe
from cdc_relay.sink.sqs.client import (
    IAM_FIX,
    MISSING,
    create_queue_command,
    error_code,
    make_client,
    refusal,
)
from cdc_relay.sink.sqs.config import SqsConfig
from cdc_relay.sink.sqs.entries import is_fifo

_SAMPLE = {"aggregate_type": "order", "event_type": "OrderPlaced", "schema": "public",
           "table": "outbox_events"}  # a sample queue name, to show what a pattern gives


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    parts = re.split(r"\{[a-z_]+\}", pattern)
    return re.compile("[A-Za-z0-9_-]+".join(re.escape(part) for part in parts))


def _queue_probe(client: Any, name: str, role: str) -> SinkProbe:
    url = client.get_queue_url(QueueName=name)["QueueUrl"]
    attributes = client.get_queue_attributes(
        QueueUrl=url, AttributeNames=["MaximumMessageSize", "FifoQueue"])["Attributes"]
    kind = "FIFO" if attributes.get("FifoQueue") == "true" else "standard (no order, no dedup)"
    return SinkProbe(role, True if is_fifo(name) else None, f"queue {name!r} exists: {kind}, "
                     f"MaximumMessageSize {attributes.get('MaximumMessageSize', '?')}",
                     "use FIFO queues (.fifo) to keep each aggregate's order and drop replays")


def probe_sqs(config: SqsConfig, timeout: float, *, client: Any = None) -> list[SinkProbe]:
    """Doctor: the endpoint answers, the credentials work, the queues exist. Changes nothing.
    ``client``: a boto3 SQS client (a fake in tests); built from ``config`` when None."""
    where = config.where
    try:
        if client is None:
            client = make_client(replace(
                config, connect_timeout=min(config.connect_timeout, timeout),
                read_timeout=min(config.read_timeout, timeout)))
        dead = _queue_probe(client, config.dead_letter_queue, "dead-letter queue")
    except ConfigError as exc:
        return [SinkProbe("sqs", False, str(exc), "give the region")]
    except Exception as exc:
        refused = refusal(exc, where)
        if refused is not None:
            return [SinkProbe("sqs", False, str(refused), IAM_FIX, ExitCode.REFUSED)]
        if error_code(exc) not in MISSING:
            return [SinkProbe("sqs", False, f"cannot reach SQS at {where}: "
                              f"{mask_secrets(str(exc) or type(exc).__name__)}",
                              "check --brokers and that the endpoint answers",
                              ExitCode.UNAVAILABLE)]
        name = config.dead_letter_queue
        dead = SinkProbe("dead-letter queue", False, f"queue {name!r} does not exist",
                         f"create it: {create_queue_command(name)}")
    return [SinkProbe("sqs", True, f"SQS at {where} answered"), dead,
            *_pattern_probes(client, config)]


def _pattern_probes(client: Any, config: SqsConfig) -> list[SinkProbe]:
    pattern = config.topic_pattern
    prefix = pattern.split("{", 1)[0]
    try:
        # SQS leaves QueueUrls out of the answer when no queue has the prefix
        urls = client.list_queues(QueueNamePrefix=prefix).get("QueueUrls", []) if prefix else []
    except Exception as exc:
        if refusal(exc, config.where) is not None:
            return [SinkProbe("queues", None, f"ListQueues was refused ({error_code(exc)}): the "
                              f"queues of {pattern!r} were not checked",
                              "grant sqs:ListQueues to let doctor check them (the relay does "
                              "not need it)")]
        return [SinkProbe("queues", None, f"cannot list queues ({error_code(exc) or exc}): the "
                          f"queues of {pattern!r} were not checked",
                          "check --brokers and that the endpoint answers")]
    regex = _pattern_regex(pattern)
    names = sorted(n for n in (u.rsplit("/", 1)[-1] for u in urls or []) if regex.fullmatch(n))
    if not names:
        example = re.sub(r"\{([a-z_]+)\}", lambda m: _SAMPLE.get(m[1], m[1]), pattern)
        return [SinkProbe("queues", None, f"no queue of {pattern!r} exists yet: `run` needs one "
                          f"per name the pattern gives (e.g. {example!r} for aggregate type "
                          "'order'); until one exists, its events wait (retried, never "
                          "dead-lettered)",
                          f"create them, e.g. {create_queue_command(example)}")]
    return [_queue_probe(client, name, "queue") for name in names]
