"""The Amazon SQS sink: SendMessageBatch from a few sender threads, per-entry results as acknowledgements.

boto3 is synchronous: each sink generation runs ``concurrency`` daemon sender threads
behind ``BackgroundSink`` (sink/background.py), so the relay keeps its single loop. An
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
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cdc_relay.errors import AccessRefused, BrokerError, mask_secrets
from cdc_relay.model import Message
from cdc_relay.sink.background import BackgroundSink
from cdc_relay.sink.base import (
    Cause,
    DeliveryError,
    DeliveryHandler,
    ErrorKind,
    Sink,
    SinkFactory,
)
from cdc_relay.sink.batches import Pending, Planner
from cdc_relay.sink.config import SinkProbe
from cdc_relay.sink.sqs.client import (
    MISSING,
    create_queue_command,
    error_code,
    make_client,
    refusal,
)
from cdc_relay.sink.sqs.config import DEFAULT_MAX_MESSAGE_BYTES, SqsConfig
from cdc_relay.sink.sqs.entries import Entry, build_entry, too_large

_log = logging.getLogger("cdc_relay.sqs")
_INVALID = ("InvalidParameterValue", "InvalidMessageContents", "BatchRequestTooLong",
            "AWS.SimpleQueueService.BatchRequestTooLong", "InvalidAttributeName",
            "InvalidAttributeValue", "MessageTooLong", "MissingParameter", "InvalidParameterCombination")
_TOO_LONG_HINTS = ("too long", "shorter than", "too large", "MessageTooLong", "BatchRequestTooLong")


class _Refused(Exception):
    pass


class _Missing(Exception):
    pass


@dataclass
class SharedState:
    """What every sink of one factory shares: an access refusal ends them all (exit 6)."""

    refused: AccessRefused | None = None


class SqsSink(BackgroundSink):
    """One boto3 client and its sender threads (one generation) as a Sink."""

    kind = "sqs"

    def __init__(self, config: SqsConfig, on_delivery: DeliveryHandler, *, generation: int = 1,
                 logger: logging.Logger | None = None, shared: SharedState | None = None,
                 client: Any = None, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(on_delivery, generation=generation, max_in_flight=config.max_in_flight,
                         message_timeout=config.message_timeout_ms / 1000, logger=logger or _log,
                         clock=clock)
        self._config = config
        self._shared = shared or SharedState()
        self._cond = threading.Condition()
        self._planner = Planner()
        self._entries: dict[int, Entry] = {}  # seq -> entry, until settled (under _cond)
        # seq -> when it was first sent, oldest first, until done: the message timeout runs
        # from there (entries waiting their turn locally are no sign of a stalled endpoint).
        self._first_sent: dict[int, float] = {}
        self._queues: dict[str, tuple[str, int]] = {}  # name -> (url, byte limit)
        self._limits: dict[str, int] = {}
        self._client: Any = client  # None: built by warm_up (make_client)
        self._staged: Entry | None = None  # _refuse's entry, for the _submit that follows
        self._warming: threading.Thread | None = None
        self._warm_error: BaseException | None = None
        self._ready = False
        self._stopping = False
        self._threads: list[threading.Thread] = []

    # -- relay thread ----------------------------------------------------------------
    def warm_up(self, timeout: float) -> None:
        """Build the client and look the dead-letter queue up; raise BrokerError, AccessRefused."""
        if self._shared.refused is not None:
            raise self._shared.refused
        if self._ready:
            return
        if self._client is None:
            self._client = make_client(self._config)
        if self._warming is None:
            self._warm_error = None
            self._warming = threading.Thread(target=self._warm, daemon=True,
                                             name=f"sqs-warm-up-{self.generation}")
            self._warming.start()
        self._warming.join(timeout)
        if self._warming.is_alive():
            raise BrokerError(f"SQS at {self._config.where} did not answer within {timeout:g} s "
                              "(check --brokers and the network)")
        self._warming = None
        if self._warm_error is not None:
            raise self._warm_error
        self._ready = True
        for n in range(self._config.concurrency):
            thread = threading.Thread(target=self._sender, daemon=True,
                                      name=f"sqs-sink-{self.generation}-{n}")
            thread.start()
            self._threads.append(thread)

    def _warm(self) -> None:
        queue = self._config.dead_letter_queue
        try:
            self._resolve(queue)
        except _Missing:
            self._log.warning("the dead-letter queue %s does not exist: dead letters wait (and "
                              "are retried) until it is created", queue, extra={"sink": self.kind})
        except _Refused as exc:
            self._warm_error = self._shared.refused or AccessRefused(str(exc))
        except Exception as exc:
            self._warm_error = BrokerError(f"SQS at {self._config.where}: "
                                           f"{mask_secrets(str(exc) or type(exc).__name__)} "
                                           "(check --brokers and that the endpoint answers)")

    def _refuse(self, message: Message) -> DeliveryError | None:
        built = build_entry(message)
        if isinstance(built, DeliveryError):
            return built
        self._staged = built
        return None

    def _submit(self, seq: int, message: Message) -> None:
        entry = self._staged
        self._staged = None
        assert entry is not None
        with self._cond:
            self._entries[seq] = entry
            self._planner.add(Pending(seq, entry.queue, entry.group, entry.size))
            self._cond.notify()

    def _check_timeout(self) -> None:
        """FATAL when an entry sent first longer than the message timeout ago is unsettled."""
        sent, pending = self._sent, self._pending
        while sent and sent[0][1] not in pending:  # the base class's record, kept trimmed
            sent.popleft()
        with self._cond:
            oldest = next(iter(self._first_sent.values()), None)
        if (oldest is not None and self._fatal is None
                and self._clock() - oldest > self._message_timeout):
            self._fail(f"no reply within {self._message_timeout:g} s of sending (message "
                       "timeout): the endpoint is stalled or unreachable")

    def _stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        deadline = time.monotonic() + self._config.read_timeout + 1
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    # -- sender threads --------------------------------------------------------------
    def _sender(self) -> None:
        while True:
            with self._cond:
                batch = self._next_batch()
                if batch is None:
                    return
                entries = [self._entries[p.seq] for p in batch]
            try:
                self._send(batch, entries)
            except Exception as exc:  # a bug must not leave events unreported for ever
                self._fail(f"sender failed: {exc!r}")
                return

    def _next_batch(self) -> list[Pending] | None:
        """Wait (holding _cond) for a batch; None when the sink stops or failed."""
        while not self._stopping and self._fatal is None:
            now = self._clock()
            batch = self._planner.take(now, self._limits, DEFAULT_MAX_MESSAGE_BYTES)
            if batch:
                for p in batch:
                    self._first_sent.setdefault(p.seq, now)
                return batch
            ready = self._planner.next_ready()
            self._cond.wait(0.5 if ready is None else min(0.5, max(0.001, ready - now)))
        return None

    def _finish(self, done: list[Pending], again: list[Pending] | None = None,
                delay: float = 0.0) -> None:
        with self._cond:
            for p in done:
                self._entries.pop(p.seq, None)
                self._first_sent.pop(p.seq, None)
            self._planner.settle(done, again or [], self._clock() + delay)
            self._cond.notify_all()

    def _send(self, batch: list[Pending], entries: list[Entry]) -> None:
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

    def _send_batch(self, queue: str, url: str, items: list[tuple[Pending, Entry]],
                    *, split: bool) -> None:
        pendings = [p for p, _ in items]
        try:
            reply = self._client.send_message_batch(QueueUrl=url, Entries=[
                {"Id": str(i), **entry.fields} for i, (_, entry) in enumerate(items)])
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
                self._give_up(pendings[0], code, str(exc))
            else:
                self._retry(pendings, f"SendMessageBatch to {queue}: {mask_secrets(str(exc))}")
            return
        self._settle_reply(pendings, reply)

    def _hold_and_send(self, queue: str, url: str, item: tuple[Pending, Entry]) -> None:
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
        self._finish(done, again, _delay(again))

    def _give_up(self, pending: Pending, code: str, text: str) -> None:
        self._report([pending.seq], _permanent(code, text))
        self._finish([pending])

    def _retry(self, pendings: list[Pending], reason: str) -> None:
        self._log.warning("%s; sending %d message(s) again", reason, len(pendings),
                          extra={"sink": self.kind})
        self._finish([], pendings, _delay(pendings))

    def _missing(self, queue: str, batch: list[Pending], reason: str) -> None:
        with self._cond:
            dropped = self._planner.drop_queue(queue)
            for p in dropped:
                self._entries.pop(p.seq, None)
        self._finish(batch)
        error = DeliveryError(ErrorKind.RETRIABLE, f"{reason}: create it "
                              f"({create_queue_command(queue)}; docs/sinks.md)", Cause.TOPIC_MISSING)
        self._report([p.seq for p in [*batch, *dropped]], error)

    def _refuse_all(self, refused: AccessRefused, pendings: list[Pending]) -> None:
        self._shared.refused = self._shared.refused or refused
        self._finish(pendings)
        self._fail(str(refused))

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


def _delay(pendings: list[Pending]) -> float:
    attempts = max((p.attempts for p in pendings), default=0)
    return min(0.1 * 2.0 ** min(attempts, 8), 2.0)


def _permanent(code: str, text: str) -> DeliveryError:
    cause = Cause.TOO_LARGE if any(h in f"{code} {text}" for h in _TOO_LONG_HINTS) else Cause.UNSPECIFIED
    return DeliveryError(ErrorKind.PERMANENT, f"SQS refused the message: {code}: {text}", cause)


def sqs_sink_factory(config: SqsConfig, *, logger: logging.Logger | None = None) -> SinkFactory:
    """A factory of SqsSinks, numbering their generations and sharing an access refusal.

    Builds a client once first (no I/O), so a missing region or unknown profile is a
    ConfigError at start-up (exit 2), not a warm-up that WAL mode would retry.
    """
    make_client(config)
    generation = 0
    shared = SharedState()

    def build(on_delivery: DeliveryHandler) -> Sink:
        nonlocal generation
        generation += 1
        return SqsSink(config, on_delivery, generation=generation, logger=logger, shared=shared)

    return build


def probe(config: SqsConfig, timeout: float) -> list[SinkProbe]:
    """Doctor: the endpoint answers, the credentials work, the queues exist (sink/sqs/probe.py)."""
    from cdc_relay.sink.sqs.probe import probe_sqs

    return probe_sqs(config, timeout)
