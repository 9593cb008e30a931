"""The NATS JetStream sink: nats-py's asyncio client on a daemon thread, PubAck as the acknowledgement.

nats-py is asyncio only. Each sink generation runs one event loop on one daemon thread,
behind ``BackgroundSink`` (sink/background.py), so the relay keeps its single
synchronous loop and no second copy of it exists. Messages reach the loop through a
deque; one drain task at a time publishes them in produce order as JetStream requests
(what ``js.publish`` does, without waiting: many PubAcks outstanding) whose reply subject
is one wildcard inbox plus the publish's sequence number, so one subscription receives
every PubAck and reports its message - no future or task per message.

Each message: subject = the message's topic; payload = the value; headers
``Nats-Msg-Id`` (the event id: the stream's duplicate window drops a replayed copy and
answers its PubAck with ``duplicate``), the message contract's headers, ``aggregate_id``
and ``timestamp`` (epoch ms). A stream covering the subjects is created at warm-up if
missing (``create_stream``), else its absence is a clear BrokerError.

Outcomes: a PubAck (duplicate or not) -> delivered. No stream for the subject (no
responders) -> PERMANENT (dead-lettered, like an unroutable RabbitMQ message). A
JetStream API error 503 -> RETRIABLE; any other -> FATAL. A lost connection -> FATAL:
nats-py's own reconnect is off, because a PubAck lost with the connection would leave
its message unreported until the timeout; the loops build a new sink instead. Only
sink/ imports nats.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import ssl
import threading
from collections import deque
from typing import Any

import nats
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import api
from nats.js.errors import APIError, NoStreamResponseError, NotFoundError

from cdc_relay.errors import AccessRefused, BrokerError, ExitCode, mask_secrets
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
from cdc_relay.sink.config import NatsConfig, SinkProbe, subject_problem

_log = logging.getLogger("cdc_relay.nats")
NO_RESPONDERS = "503"  # the status a request gets when no stream takes its subject


def is_refusal(error: BaseException) -> bool:
    """Whether NATS refused the credentials or a permission (nats-py says it in text)."""
    text = str(error).lower()
    return any(word in text for word in ("authorization violation", "authentication",
                                         "permissions violation"))


def classify(error: BaseException, subject: str) -> DeliveryError:
    """The ErrorKind of a failed PubAck (module docstring)."""
    if isinstance(error, NoStreamResponseError):
        return DeliveryError(ErrorKind.PERMANENT, f"no JetStream stream covers subject {subject!r} "
                             "(add the subject to the stream, or fix --topic-pattern)")
    if isinstance(error, APIError):
        kind = ErrorKind.RETRIABLE if error.code == 503 else ErrorKind.FATAL
        return DeliveryError(kind, f"JetStream refused the message: {error.description} "
                             f"(code {error.code}, err_code {error.err_code})")
    return DeliveryError(ErrorKind.FATAL, f"publish failed: {error!r}")


def _json_flag(data: bytes, key: str) -> bool:
    try:
        return bool(json.loads(data).get(key))
    except (ValueError, AttributeError):
        return False


def headers(message: Message) -> dict[str, str]:
    """The NATS headers of a message (see the module docstring)."""
    result = {k: v.decode("utf-8", "replace") for k, v in message.headers}
    result["aggregate_id"] = (message.key or b"").decode("utf-8", "replace")
    if message.timestamp_ms is not None:
        result["timestamp"] = str(message.timestamp_ms)
    event_id = result.get("id")
    if event_id:
        result["Nats-Msg-Id"] = event_id
    return result


def connect_options(config: NatsConfig) -> dict[str, Any]:
    """Keyword arguments of ``nats.connect`` for the sink (no reconnect: see the docstring)."""
    options: dict[str, Any] = {"servers": list(config.servers), "allow_reconnect": False,
                               "connect_timeout": 5, "name": "cdc-relay"}
    for key in ("user", "password", "token"):
        if getattr(config, key):
            options[key] = getattr(config, key)
    if config.credentials_file:
        options["user_credentials"] = config.credentials_file
    if config.tls_ca_file or config.tls_cert_file:
        context = ssl.create_default_context(cafile=config.tls_ca_file)
        if config.tls_cert_file:
            context.load_cert_chain(config.tls_cert_file, config.tls_key_file)
        options["tls"] = context
    return options


class NatsSink(BackgroundSink):
    """One NATS connection and JetStream context (one generation) as a Sink."""

    kind = "nats"

    def __init__(self, config: NatsConfig, on_delivery: DeliveryHandler, *,
                 generation: int = 1, logger: logging.Logger | None = None) -> None:
        super().__init__(on_delivery, generation=generation, max_in_flight=config.max_in_flight,
                         message_timeout=config.message_timeout_ms / 1000, logger=logger or _log)
        self._config = config
        self._outbox: deque[tuple[int, Message]] = deque()
        self._scheduled = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._connected: Any = None  # concurrent Future of _connect
        self._drainer: asyncio.Task[None] | None = None
        self._nc: Client | None = None
        self._js: Any = None
        self._closing = False
        self._max_payload = 1 << 20
        self._reply_prefix = ""
        self._subjects: dict[int, str] = {}  # seq -> subject, until its PubAck (error texts)
        self._acked: list[int] = []
        self._flush_scheduled = False
        self.duplicates = 0  # PubAcks with duplicate=True: replays the stream dropped

    # -- relay thread ----------------------------------------------------------------
    def warm_up(self, timeout: float) -> None:
        """Connect and make sure the stream exists; raise BrokerError if that fails.

        After a failed attempt (and nothing produced) it tries again with a new connection.
        """
        failed = self._connected is not None and self._connected.done() and (
            self._connected.exception() is not None or self._fatal is not None)
        where = ",".join(mask_secrets(s) for s in self._config.servers)
        if failed and self._refused:
            self._raise_failure(f"NATS at {where}")
        if failed and (self._retry_allowed() or self._fatal is None):
            if not self._may_reconnect(timeout):
                self._raise_failure(f"NATS at {where}")
                raise BrokerError(f"NATS at {where} is not reachable (retrying)")
            self._stop()
            self._thread = self._loop = self._connected = self._nc = self._js = None
            self._drainer = None
            self._closing = False
            self._subjects.clear()
            self._acked = []
            self._clear_failure()
        self._start()
        try:
            self._connected.result(timeout)
        except TimeoutError as exc:
            raise BrokerError(f"NATS at {where} did not answer within {timeout:g} s (check "
                              "--brokers and that nats-server runs with JetStream)") from exc
        except BrokerError:
            raise
        except Exception as exc:
            if is_refusal(exc):
                reason = (f"{mask_secrets(str(exc))} (check the credentials in --brokers or "
                          "--sink-config, and the user's publish permissions)")
                self._fail(reason, refused=True)
                self._refused = True  # also when a disconnect callback failed it first
                raise AccessRefused(f"NATS at {where} refused the relay: {reason}") from exc
            self._fail(mask_secrets(str(exc) or type(exc).__name__))
            raise BrokerError(f"cannot connect to NATS at {where}: "
                              f"{mask_secrets(str(exc) or type(exc).__name__)} (check --brokers "
                              "and the credentials)") from exc
        if self._fatal is not None:
            raise BrokerError(f"NATS at {where}: {self._fatal.reason}")

    def _refuse(self, message: Message) -> DeliveryError | None:
        problem = subject_problem(message.topic)
        if problem is not None:
            return DeliveryError(ErrorKind.PERMANENT, problem)
        if len(message.value or b"") > self._max_payload:
            return DeliveryError(ErrorKind.PERMANENT, f"message too large: {len(message.value or b'')} "
                                 f"bytes > max_payload {self._max_payload}", Cause.TOO_LARGE)
        return None

    def _submit(self, seq: int, message: Message) -> None:
        self._start()
        self._outbox.append((seq, message))
        if not self._scheduled:
            self._scheduled = True
            assert self._loop is not None
            self._loop.call_soon_threadsafe(self._kick)

    def _start(self) -> None:
        if self._thread is not None:
            return
        loop = self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=loop.run_forever, daemon=True,
                                        name=f"nats-sink-{self.generation}")
        self._thread.start()
        self._connected = asyncio.run_coroutine_threadsafe(self._connect(), loop)

    def _stop(self) -> None:
        self._closing = True
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        with contextlib.suppress(Exception):  # closing anyway
            asyncio.run_coroutine_threadsafe(self._disconnect(), loop).result(5.0)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5.0)
        if not thread.is_alive():
            loop.close()
        if self.duplicates:
            self._log.info("nats sink generation %d: the stream dropped %d duplicate(s) by "
                           "Nats-Msg-Id", self.generation, self.duplicates,
                           extra={"sink": self.kind, "duplicates": self.duplicates})

    # -- event loop thread -----------------------------------------------------------
    async def _connect(self) -> None:
        config = self._config
        self._nc = await nats.connect(**connect_options(config), disconnected_cb=self._on_lost,
                                      closed_cb=self._on_lost, error_cb=self._on_error)
        self._max_payload = self._nc.max_payload
        self._js = self._nc.jetstream()
        # PubAcks come back on one wildcard inbox; the last token is the publish's seq.
        self._reply_prefix = self._nc.new_inbox() + "."
        await self._nc.subscribe(self._reply_prefix + "*", cb=self._on_reply,
                                 pending_msgs_limit=4 * config.max_in_flight + 1024)
        try:
            await self._js.stream_info(config.stream)
        except NotFoundError:
            if not config.create_stream:
                raise BrokerError(f"JetStream stream {config.stream!r} does not exist and "
                                  "create_stream=false: create it (covering the relay's subjects) "
                                  "or drop that setting") from None
            await self._js.add_stream(api.StreamConfig(
                name=config.stream, subjects=list(config.stream_subjects),
                duplicate_window=config.duplicate_window, storage=api.StorageType.FILE))
            self._log.info("created JetStream stream %s on %s", config.stream,
                           ", ".join(config.stream_subjects), extra={"sink": self.kind})
        self._kick()

    async def _disconnect(self) -> None:
        nc = self._nc
        if nc is not None and not nc.is_closed:
            await nc.close()

    async def _on_lost(self) -> None:
        if not self._closing:
            self._fail("connection to NATS lost")

    async def _on_error(self, error: Exception) -> None:
        if not self._closing and not is_refusal(error):  # a refusal is the exit's one line
            self._log.warning("nats sink generation %d: %s", self.generation,
                              mask_secrets(str(error) or type(error).__name__),
                              extra={"sink": self.kind})

    def _kick(self) -> None:
        if self._js is not None and (self._drainer is None or self._drainer.done()):
            self._drainer = asyncio.ensure_future(self._drain())

    async def _drain(self) -> None:
        outbox, nc, prefix, subjects = self._outbox, self._nc, self._reply_prefix, self._subjects
        assert nc is not None
        while True:
            self._scheduled = False  # before the check: an append after it schedules a new kick
            if not outbox or self._fatal is not None:
                return
            while outbox:
                seq, message = outbox.popleft()
                subjects[seq] = message.topic
                try:
                    # A JetStream publish is a request: the stream answers the reply subject.
                    await nc.publish(message.topic, message.value or b"", reply=f"{prefix}{seq}",
                                     headers=headers(message))
                except Exception as exc:
                    self._fail(f"publish failed: {exc!r}")
                    return

    async def _on_reply(self, reply: Msg) -> None:
        seq = int(reply.subject[len(self._reply_prefix):])
        subject = self._subjects.pop(seq, "?")
        status = reply.headers.get(api.Header.STATUS) if reply.headers else None
        if status == NO_RESPONDERS:
            self._report([seq], classify(NoStreamResponseError(), subject))
            return
        data = reply.data
        if b'"error"' in data:  # a PubAck is {"stream":..,"seq":..[,"duplicate":true]}
            try:
                error: BaseException = APIError.from_error(json.loads(data)["error"])
            except (APIError, ValueError, KeyError, TypeError) as exc:
                error = exc
            self._report([seq], classify(error, subject))
            return
        if b'"duplicate"' in data and _json_flag(data, "duplicate"):  # rare: parse only then
            self.duplicates += 1
        self._acked.append(seq)
        if not self._flush_scheduled:  # one report per burst of PubAcks
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush_acks)

    def _flush_acks(self) -> None:
        self._flush_scheduled = False
        acked, self._acked = self._acked, []
        if acked:
            self._report(acked, None)


def nats_sink_factory(config: NatsConfig, *, logger: logging.Logger | None = None) -> SinkFactory:
    """A factory of NatsSinks, numbering their generations."""
    generation = 0

    def build(on_delivery: DeliveryHandler) -> Sink:
        nonlocal generation
        generation += 1
        return NatsSink(config, on_delivery, generation=generation, logger=logger)

    return build


async def _probe(config: NatsConfig, timeout: float) -> list[SinkProbe]:
    where = ",".join(mask_secrets(s) for s in config.servers)
    try:
        nc = await asyncio.wait_for(nats.connect(**connect_options(config)), timeout)
    except Exception as exc:
        return [SinkProbe("nats", False, f"cannot connect to {where}: "
                          f"{mask_secrets(str(exc) or type(exc).__name__)}",
                          "check --brokers and the credentials, and that nats-server runs",
                          ExitCode.REFUSED if is_refusal(exc) else ExitCode.UNAVAILABLE)]
    found = [SinkProbe("nats", True, f"connected to {where}")]
    try:
        js = nc.jetstream()
        try:
            await js.account_info()
        except Exception as exc:
            return [*found, SinkProbe("jetstream", False, f"JetStream is not available: {exc}",
                                      "start nats-server with -js (JetStream enabled)")]
        try:
            info = await js.stream_info(config.stream)
            found.append(SinkProbe("stream", True, f"stream {config.stream!r} exists, subjects "
                                   + ", ".join(info.config.subjects or ())))
        except NotFoundError:
            found.append(SinkProbe(
                "stream", None if config.create_stream else False,
                f"stream {config.stream!r} does not exist"
                + ("; the relay creates it on " + ", ".join(config.stream_subjects)
                   if config.create_stream else " and create_stream=false"),
                "the user needs JetStream API permissions ($JS.API.STREAM.CREATE)"
                if config.create_stream else f"create stream {config.stream!r}"))
    finally:
        await nc.close()
    return found


def probe(config: NatsConfig, timeout: float) -> list[SinkProbe]:
    """Doctor: connect, JetStream available, the stream exists (or will be created)."""
    return asyncio.run(_probe(config, timeout))
