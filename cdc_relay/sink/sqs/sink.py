"""The Amazon SQS sink: SendMessageBatch from a few sender threads, per-entry results as acknowledgements.

boto3 is synchronous: each sink generation runs ``concurrency`` daemon sender threads
behind ``PlannedSink`` (sink/planned.py), so the relay keeps its single loop. An
event counts as delivered only when a SendMessageBatch reply lists its entry under
``Successful`` (docs/design.md, the acknowledgement invariant). What goes into a batch
(at most 10 entries of one queue within its MaximumMessageSize, one entry per message
group at a time, a failed entry holding back the later ones of its group) is
sink/batches.py's; what an entry holds (body, attributes, group and deduplication
ids) is sink/sqs/entries.py's.

Outcomes (docs/sinks.md, Amazon SQS):

* listed under Successful -> delivered;
* listed under Failed with SenderFault -> PERMANENT (a dead letter; TOO_LARGE, whose dead
  letter omits the payload, when SQS says the message is too long); without SenderFault
  -> sent again, alone of its group, after a short wait;
* the whole call refused as invalid (a batch too long, a parameter SQS refuses) -> each
  entry is sent alone to find the one at fault, which is PERMANENT;
* the queue does not exist -> RETRIABLE with Cause.TOPIC_MISSING for its entries (retried,
  never a dead letter, as a missing Kafka topic);
* credentials or authorization refused -> AccessRefused (exit 6): the generation fails
  and every later ``warm_up`` of the factory's sinks raises it;
* throttling, a server error, a lost or timed-out connection -> the batch is sent again
  after a wait; a message unconfirmed past the message timeout makes the sink FATAL.

Queue URLs and MaximumMessageSize come from GetQueueUrl / GetQueueAttributes, once per
queue and generation; the client and how its errors read are sink/sqs/client.py's.
Only sink/ imports boto3.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from cdc_relay.errors import AccessRefused, mask_secrets
from cdc_relay.model import Message
from cdc_relay.sink.base import (
    Cause,
    DeliveryError,
    DeliveryHandler,
    ErrorKind,
    SinkFactory,
)
from cdc_relay.sink.batches import Pending
from cdc_relay.sink.config import SinkProbe
from cdc_relay.sink.planned import (
    Outgoing,
    PlannedSink,
    SharedState,
    backoff_delay,
    planned_factory,
)
from cdc_relay.sink.sqs.client import (
    MISSING,
    create_queue_command,
    error_code,
    make_client,
    refusal,
)
from cdc_relay.sink.sqs.config import DEFAULT_MAX_MESSAGE_BYTES, SqsConfig
from cdc_relay.sink.sqs.entries import build_entry, too_large

_INVALID = ("InvalidParameterValue", "InvalidMessageContents", "BatchRequestTooLong",
            "AWS.SimpleQueueService.BatchRequestTooLong", "InvalidAttributeName",
            "InvalidAttributeValue", "MessageTooLong", "MissingParameter", "InvalidParameterCombination")
_TOO_LONG_HINTS = ("too long", "shorter than", "too large", "MessageTooLong", "BatchRequestTooLong")


class _Refused(Exception):
    pass


class _Missing(Exception):
    pass


class SqsSink(PlannedSink[SqsConfig]):
    """One boto3 client and its sender threads (one generation) as a Sink."""

    kind = "sqs"
    title = "SQS"
    peer = "endpoint"
    default_limit = DEFAULT_MAX_MESSAGE_BYTES
    quiet_refusal = False  # as before PlannedSink: the failed generation logged at ERROR

    def __init__(self, config: SqsConfig, on_delivery: DeliveryHandler, *, generation: int = 1,
                 logger: logging.Logger | None = None, shared: SharedState | None = None,
                 client: Any = None, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(config, on_delivery, generation=generation, logger=logger,
                         shared=shared, client=client, clock=clock)
        self._queues: dict[str, tuple[str, int]] = {}  # name -> (url, byte limit)

    # -- relay thread ----------------------------------------------------------------
    def warm_up(self, timeout: float) -> None:
        """Build the client and look the dead-letter queue up; raise BrokerError, AccessRefused."""
        if self._shared.refused is None and not self._ready and self._client is None:
            self._client = make_client(self._config)  # no I/O: on the relay thread
        super().warm_up(timeout)

    def _connect(self) -> None:
        queue = self._config.dead_letter_queue
        try:
            self._resolve(queue)
        except _Missing:
            self._log.warning("the dead-letter queue %s does not exist: dead letters wait (and "
                              "are retried) until it is created", queue, extra={"sink": self.kind})
        except _Refused as exc:
            raise self._shared.refused or AccessRefused(str(exc)) from exc

    def _build(self, message: Message) -> Outgoing | DeliveryError:
        return build_entry(message)

    def _stop_wait(self) -> float:
        return self._config.read_timeout + 1

    def _missing_reason(self, queue: str, reason: str) -> str:
        return f"{reason}: create it ({create_queue_command(queue)}; docs/sinks.md)"

    # -- sender threads --------------------------------------------------------------
    def _send(self, batch: list[Pending], entries: list[Outgoing]) -> None:
        queue = batch[0].queue
        try:
            url, limit = self._resolve(queue)
        except _Missing as exc:
            self._missing(queue, batch, str(exc))
            return
        except _Refused:
            self._finish(batch)
            return
        except Exception as exc:
            self._retry(batch, f"looking up queue {queue}: {exc!r}")
            return
        oversized = [p for p in batch if p.size > limit]
        for p in oversized:
            self._report([p.seq], too_large(p.size, limit))
        keep, spill, room = [], [], limit
        for p, entry in zip(batch, entries, strict=True):
            if p.size > limit:
                continue
            if p.size <= room:
                keep.append((p, entry))
                room -= p.size
            else:
                spill.append(p)
        self._finish(oversized)
        if spill:
            self._finish([], spill)
        if keep:
            self._send_batch(queue, url, keep, split=len(keep) > 1)

    def _send_batch(self, queue: str, url: str, items: list[tuple[Pending, Outgoing]],
                    *, split: bool) -> None:
        pendings = [p for p, _ in items]
        try:
            reply = self._client.send_message_batch(QueueUrl=url, Entries=[
                {"Id": str(i), **entry.data} for i, (_, entry) in enumerate(items)])
        except Exception as exc:
            code = error_code(exc)
            refused = refusal(exc, self._config.where)
            if refused is not None:
                self._refuse_all(refused, pendings)
            elif code in MISSING:
                with self._cond:
                    self._queues.pop(queue, None)
                    self._limits.pop(queue, None)
                self._missing(queue, pendings, f"queue {queue!r} does not exist")
            elif code in _INVALID and split:
                self._finish([], pendings)  # back in place, at once
                for item in items:
                    self._hold_and_send(queue, url, item)
            elif code in _INVALID:
                self._give_up([pendings[0]], _permanent(code, str(exc)))
            else:
                self._retry(pendings, f"SendMessageBatch to {queue}: {mask_secrets(str(exc))}")
            return
        self._settle_reply(pendings, reply)

    def _hold_and_send(self, queue: str, url: str, item: tuple[Pending, Outgoing]) -> None:
        """Send one entry of a refused batch alone (its group is busy again meanwhile)."""
        with self._cond:
            if not self._planner.claim(item[0]):
                return  # another sender took it already
        self._send_batch(queue, url, [item], split=False)

    def _settle_reply(self, pendings: list[Pending], reply: dict[str, Any]) -> None:
        delivered = [pendings[int(ok["Id"])] for ok in reply.get("Successful", ())]
        done, again = list(delivered), []
        for failed in reply.get("Failed", ()):
            pending = pendings[int(failed["Id"])]
            code, text = str(failed.get("Code", "")), str(failed.get("Message", ""))
            if failed.get("SenderFault"):
                self._report([pending.seq], _permanent(code, text))
                done.append(pending)
            else:
                again.append(pending)
                self._log.warning("SQS failed entry of %s (%s: %s): sending it again",
                                  pending.queue, code, text, extra={"sink": self.kind})
        if delivered:
            self._report([p.seq for p in delivered], None)
        self._finish(done, again, backoff_delay(max((p.attempts for p in again), default=0)))

    def _resolve(self, queue: str) -> tuple[str, int]:
        """The queue's URL and byte limit (GetQueueUrl, GetQueueAttributes; cached)."""
        known = self._queues.get(queue)
        if known is not None:
            return known
        try:
            url = self._client.get_queue_url(QueueName=queue)["QueueUrl"]
            attributes = self._client.get_queue_attributes(
                QueueUrl=url, AttributeNames=["MaximumMessageSize"])["Attributes"]
        except Exception as exc:
            refused = refusal(exc, self._config.where)
            if refused is not None:
                self._shared.refused = self._shared.refused or refused
                self._fail(str(refused))
                raise _Refused(str(refused)) from exc
            if error_code(exc) in MISSING:
                raise _Missing(f"queue {queue!r} does not exist") from exc
            raise
        limit = int(attributes.get("MaximumMessageSize", DEFAULT_MAX_MESSAGE_BYTES))
        with self._cond:
            self._queues[queue] = (url, limit)
            self._limits[queue] = limit
        return url, limit


def _permanent(code: str, text: str) -> DeliveryError:
    cause = Cause.TOO_LARGE if any(h in f"{code} {text}" for h in _TOO_LONG_HINTS) else Cause.UNSPECIFIED
    return DeliveryError(ErrorKind.PERMANENT, f"SQS refused the message: {code}: {text}", cause)


def sqs_sink_factory(config: SqsConfig, *, logger: logging.Logger | None = None) -> SinkFactory:
    """A factory of SqsSinks (a client built once first: a bad region or profile is exit 2)."""
    return planned_factory(SqsSink, config, logger=logger, check=make_client)


def probe(config: SqsConfig, timeout: float) -> list[SinkProbe]:
    """Doctor: the endpoint answers, the credentials work, the queues exist (sink/sqs/probe.py)."""
    from cdc_relay.sink.sqs.probe import probe_sqs

    return probe_sqs(config, timeout)
