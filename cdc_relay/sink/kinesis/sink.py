"""The Amazon Kinesis sink: PutRecords from a few sender threads, per-record results as acknowledgements.

boto3 is synchronous: each sink generation runs ``concurrency`` sender threads behind
``PlannedSink`` (sink/planned.py). A batch is one stream's records - at most
``batch_size`` (500) records and 5 MiB, and at most one record per partition key - sent
as one PutRecords; an event counts as delivered only when the reply's record at its place
has a SequenceNumber (docs/design.md, the acknowledgement invariant). What a record holds
is sink/kinesis/records.py's.

Why one record per partition key per call: Kinesis may fail any record of a call
(``ProvisionedThroughputExceededException``, ``InternalFailure``) and store the others.
Were an aggregate's next record in the same call, it could be stored - and acknowledged -
before the failed one, which goes in again after it: the aggregate's order on its shard
would be broken. So an aggregate's next record is sent only once the previous one was
stored (or dead-lettered), and a failed record is sent again, alone of its key, holding
back its key's later records and nothing else (docs/sinks.md, Amazon Kinesis).

Outcomes:

* a SequenceNumber -> delivered;
* a record's ErrorCode ``ProvisionedThroughputExceededException``, ``InternalFailure``,
  ``KMSThrottlingException`` and the other KMS states -> that record alone sent again
  after a backoff; ``KMSAccessDeniedException`` -> AccessRefused (exit 6);
* the stream does not exist -> RETRIABLE with Cause.TOPIC_MISSING (never a dead letter);
* the whole call refused as invalid -> each record sent alone to find the one at fault,
  which is PERMANENT;
* credentials or permissions refused -> AccessRefused for every later sink;
* throttling of the whole call, a server error, a lost or timed-out connection -> the
  batch sent again after a wait; unsettled past the message timeout -> FATAL (replay).

Only sink/ imports boto3.
"""

from __future__ import annotations

import logging
from typing import Any

from cdc_relay.errors import BrokerError, mask_secrets
from cdc_relay.model import Message
from cdc_relay.sink.base import DeliveryError, ErrorKind, SinkFactory
from cdc_relay.sink.batches import Pending
from cdc_relay.sink.config import SinkProbe
from cdc_relay.sink.kinesis.client import MISSING, error_code, make_client, refusal
from cdc_relay.sink.kinesis.config import MAX_BATCH_BYTES, KinesisConfig
from cdc_relay.sink.kinesis.records import build_record
from cdc_relay.sink.planned import Outgoing, PlannedSink, planned_factory

_INVALID = ("ValidationException", "InvalidArgumentException", "SerializationException")


class KinesisSink(PlannedSink[KinesisConfig]):
    """One boto3 Kinesis client and its sender threads (one generation) as a Sink."""

    kind = "kinesis"
    default_limit = MAX_BATCH_BYTES

    def _build(self, message: Message) -> Outgoing | DeliveryError:
        return build_record(message, self._config.record_format)

    def _connect(self) -> None:
        if self._client is None:
            self._client = make_client(self._config)
        stream = self._config.dead_letter_stream
        try:
            self._client.describe_stream_summary(StreamName=stream)
        except Exception as exc:
            refused = refusal(exc, self._config.where)
            if refused is not None:
                raise refused from exc
            if error_code(exc) in MISSING:
                self._log.warning("the dead-letter stream %s does not exist: dead letters wait "
                                  "(and are retried) until it is created", stream,
                                  extra={"sink": self.kind})
                return
            raise BrokerError(f"Kinesis at {self._config.where}: "
                              f"{mask_secrets(str(exc) or type(exc).__name__)} "
                              "(check --brokers and that the endpoint answers)") from exc

    def _send(self, batch: list[Pending], items: list[Outgoing]) -> None:
        self._put(batch, items, split=len(batch) > 1)

    def _put(self, batch: list[Pending], items: list[Outgoing], *, split: bool) -> None:
        stream = batch[0].queue
        try:
            reply = self._client.put_records(StreamName=stream,
                                             Records=[item.data for item in items])
        except Exception as exc:
            code = error_code(exc)
            refused = refusal(exc, self._config.where)
            if refused is not None:
                self._refuse_all(refused, batch)
            elif code in MISSING:
                self._missing(stream, batch, f"stream {stream!r} does not exist")
            elif code in _INVALID and split:
                for pending, item in zip(batch, items, strict=True):
                    self._put([pending], [item], split=False)
            elif code in _INVALID:
                self._give_up(batch, DeliveryError(
                    ErrorKind.PERMANENT, f"Kinesis refused the record: {code}: {exc}"))
            else:
                self._retry(batch, f"PutRecords to {stream}: {mask_secrets(str(exc))}")
            return
        self._settle(batch, reply)

    def _settle(self, batch: list[Pending], reply: dict[str, Any]) -> None:
        results = reply.get("Records", [])
        if len(results) != len(batch):  # never seen; a reply that cannot be matched is no ack
            self._retry(batch, f"PutRecords answered {len(results)} results for {len(batch)} records")
            return
        delivered, again, reason = [], [], ""
        for pending, result in zip(batch, results, strict=True):
            code = result.get("ErrorCode")
            if not code and result.get("SequenceNumber"):
                delivered.append(pending)
                continue
            refused = refusal(str(code), self._config.where)
            if refused is not None:
                self._deliver(delivered)
                self._refuse_all(refused, [p for p in batch if p not in delivered])
                return
            again.append(pending)
            reason = f"Kinesis failed a record of {pending.queue} ({code}: {result.get('ErrorMessage')})"
        self._deliver(delivered)
        self._retry(again, reason)


def kinesis_sink_factory(config: KinesisConfig, *, logger: logging.Logger | None = None) -> SinkFactory:
    """A factory of KinesisSinks (a client built once first: a bad region or profile is exit 2)."""
    return planned_factory(KinesisSink, config, logger=logger, check=make_client)


def probe(config: KinesisConfig, timeout: float) -> list[SinkProbe]:
    """Doctor: the endpoint answers, the credentials work, the streams exist (probe.py)."""
    from cdc_relay.sink.kinesis.probe import probe_kinesis

    return probe_kinesis(config, timeout)
