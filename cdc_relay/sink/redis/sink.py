"""The Redis Streams sink: pipelines of XADD from a few sender threads, each reply an acknowledgement.

redis-py is synchronous: each sink generation runs ``concurrency`` sender threads behind
``PlannedSink`` (sink/planned.py). A batch is one stream's entries, at most one per
aggregate, sent as one pipeline (no MULTI) of ``XADD stream [MAXLEN ~ N] * field value
...``; an event counts as delivered only when its XADD's reply is the new entry's id
(docs/design.md, the acknowledgement invariant). What an entry holds is
sink/redis/entries.py's.

Outcomes (docs/sinks.md, Redis Streams):

* an entry id -> delivered;
* ``WRONGTYPE`` (the key holds something other than a stream) -> PERMANENT: a dead letter;
* ``NOAUTH``, ``WRONGPASS``, ``NOPERM`` -> AccessRefused (exit 6) for every later sink;
* any other error reply (``OOM``, ``LOADING``, ``READONLY``, ``BUSY``, ...) or a lost,
  refused or timed-out connection -> sent again after a wait, the aggregate's later
  entries waiting behind it; unsettled past the message timeout -> FATAL (replay).

The client and how its errors read are sink/redis/client.py's. Only sink/ imports redis.
"""

from __future__ import annotations

import logging

from cdc_relay.errors import BrokerError, mask_secrets
from cdc_relay.model import Message
from cdc_relay.sink.base import DeliveryError, ErrorKind, SinkFactory
from cdc_relay.sink.batches import Pending
from cdc_relay.sink.config import SinkProbe
from cdc_relay.sink.planned import Outgoing, PlannedSink, planned_factory
from cdc_relay.sink.redis.client import make_client, refusal
from cdc_relay.sink.redis.config import RedisConfig
from cdc_relay.sink.redis.entries import build_entry


class RedisSink(PlannedSink[RedisConfig]):
    """One redis-py client and its sender threads (one generation) as a Sink."""

    kind = "redis"

    def _build(self, message: Message) -> Outgoing | DeliveryError:
        return build_entry(message, self._config.max_message_bytes)

    def _connect(self) -> None:
        self._client = make_client(self._config)
        try:
            self._client.ping()
        except Exception as exc:
            refused = refusal(exc, self._config.where)
            if refused is not None:
                raise refused from exc
            raise BrokerError(f"Redis at {self._config.where}: {mask_secrets(str(exc))} "
                              "(check --brokers and that redis-server answers)") from exc

    def _close_client(self) -> None:
        if self._client is not None:
            self._client.close()

    def _send(self, batch: list[Pending], items: list[Outgoing]) -> None:
        maxlen = self._config.maxlen or None
        pipe = self._client.pipeline(transaction=False)
        for item in items:
            pipe.xadd(item.queue, item.data, maxlen=maxlen, approximate=True)
        try:
            replies = pipe.execute(raise_on_error=False)
        except Exception as exc:
            refused = refusal(exc, self._config.where)
            if refused is not None:
                self._refuse_all(refused, batch)
            else:
                self._retry(batch, f"XADD to {batch[0].queue}: {mask_secrets(str(exc))}")
            return
        delivered, again = [], []
        reason = ""
        for pending, reply in zip(batch, replies, strict=True):
            if not isinstance(reply, Exception):
                delivered.append(pending)
                continue
            text = str(reply)
            refused = refusal(reply, self._config.where)
            if refused is not None:
                self._deliver(delivered)
                self._refuse_all(refused, [p for p in batch if p not in delivered])
                return
            if text.startswith("WRONGTYPE"):
                self._give_up([pending], DeliveryError(
                    ErrorKind.PERMANENT, f"Redis refused XADD to {pending.queue!r}: {text} (the "
                    "key holds another type than a stream: rename it, or fix --topic-pattern)"))
            else:
                again.append(pending)
                reason = f"Redis refused XADD to {pending.queue!r}: {text}"
        self._deliver(delivered)
        self._retry(again, reason)


def redis_sink_factory(config: RedisConfig, *, logger: logging.Logger | None = None) -> SinkFactory:
    """A factory of RedisSinks, numbering their generations and sharing an access refusal."""
    return planned_factory(RedisSink, config, logger=logger)


def probe(config: RedisConfig, timeout: float) -> list[SinkProbe]:
    """Doctor: Redis answers, the credentials work, the streams' keys are streams (probe.py)."""
    from cdc_relay.sink.redis.probe import probe_redis

    return probe_redis(config, timeout)
