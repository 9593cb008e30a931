"""The HTTP sink: a request per event (or per batch) from a few sender threads, a 2xx its acknowledgement.

httpx's client is synchronous here: each sink generation runs ``concurrency`` sender
threads behind ``PlannedSink`` (sink/planned.py), at most ``max_per_host`` of them
talking to one host at once. A batch is one URL's events, at most one per aggregate, an
aggregate's next event sent only once the previous one was answered (or dead-lettered):
a retried event holds back its aggregate's later ones, never others (docs/sinks.md,
HTTP). What a request holds, and the signature, are sink/http/requests.py's.

Answers (docs/design.md, the acknowledgement invariant: delivered only on a 2xx):

* 2xx -> delivered;
* 408, 429, 5xx, a timeout, a refused or lost connection -> sent again after the
  ``Retry-After`` the answer gave (at most ``max_retry_after``), else a backoff of 0.1 s
  doubling to 2 s; unsettled past the message timeout -> FATAL (replay);
* 413 for one event -> PERMANENT TOO_LARGE (its dead letter omits the payload in WAL mode);
* any other answer (3xx, 4xx) -> sent again until ``max_attempts`` answers, then
  PERMANENT: a dead letter naming the status and the start of the body.

Only sink/ imports httpx.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from urllib.parse import urlsplit

import httpx

from cdc_relay.errors import mask_secrets
from cdc_relay.model import Message
from cdc_relay.sink.base import Cause, DeliveryError, DeliveryHandler, ErrorKind, SinkFactory
from cdc_relay.sink.batches import Pending
from cdc_relay.sink.config import SinkProbe
from cdc_relay.sink.http import requests
from cdc_relay.sink.http.client import make_client
from cdc_relay.sink.http.config import HttpConfig
from cdc_relay.sink.planned import Outgoing, PlannedSink, SharedState, planned_factory
from cdc_relay.text import shorten

_RETRIED = (408, 429)


def host_of(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


class HttpSink(PlannedSink[HttpConfig]):
    """One httpx client and its sender threads (one generation) as a Sink."""

    kind = "http"

    def __init__(self, config: HttpConfig, on_delivery: DeliveryHandler, *, generation: int = 1,
                 logger: logging.Logger | None = None, shared: SharedState | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(config, on_delivery, generation=generation, logger=logger,
                         shared=shared, clock=clock)
        self._per_host: dict[str, int] = {}  # requests in flight, under _cond

    def _build(self, message: Message) -> Outgoing | DeliveryError:
        try:
            url = requests.url_of(self._config.url_template, message)
        except (KeyError, IndexError, ValueError) as exc:
            return DeliveryError(ErrorKind.PERMANENT, f"cannot fill the URL template: {exc!r}")
        return Outgoing(url, (message.key or b"").decode("utf-8", "replace"), len(message.value or b""),
                        message)

    def _connect(self) -> None:
        if self._client is None:
            self._client = make_client(self._config)

    def _close_client(self) -> None:
        if self._client is not None:
            self._client.close()

    def _allowed(self, queue: str) -> bool:
        return self._per_host.get(host_of(queue), 0) < self._config.max_per_host

    def _took(self, items: list[Outgoing]) -> None:
        host = host_of(items[0].queue)
        self._per_host[host] = self._per_host.get(host, 0) + 1

    def _sent_batch(self, items: list[Outgoing]) -> None:
        host = host_of(items[0].queue)
        with self._cond:
            self._per_host[host] -= 1
            self._cond.notify_all()

    def _send(self, batch: list[Pending], items: list[Outgoing]) -> None:
        url = items[0].queue
        messages: list[Message] = [item.data for item in items]
        if self._config.batch_size == 1:
            body, headers = requests.single(messages[0])
        else:
            body, headers = requests.batch(messages)
        headers = requests.signed(headers, self._config.signing_secret, int(time.time()), body)
        try:
            answer = self._client.request(self._config.method, url, content=body, headers=headers)
        except httpx.HTTPError as exc:
            self._retry(batch, f"{self._config.method} {mask_secrets(url)}: "
                        f"{type(exc).__name__}: {mask_secrets(str(exc)) or 'no answer'}")
            return
        status = answer.status_code
        if 200 <= status < 300:
            self._deliver(batch)
            return
        said = f"{self._config.method} {mask_secrets(url)} answered {status}"
        if status in _RETRIED or status >= 500:
            wait = requests.retry_after(answer.headers.get("Retry-After"), time.time(),
                                        self._config.max_retry_after)
            self._retry(batch, said + (f" (Retry-After {wait:g} s)" if wait is not None else ""),
                        wait)
            return
        text = shorten(" ".join(answer.text.split()), 200)
        if status == 413 and len(batch) == 1:
            self._give_up(batch, DeliveryError(ErrorKind.PERMANENT, f"{said} (Payload Too Large): "
                                               f"{text}", Cause.TOO_LARGE))
        elif max(p.attempts for p in batch) + 1 >= self._config.max_attempts:
            self._give_up(batch, DeliveryError(
                ErrorKind.PERMANENT, f"{said} {self._config.max_attempts} times: {text}"))
        else:
            self._retry(batch, said + f": {text}")


def http_sink_factory(config: HttpConfig, *, logger: logging.Logger | None = None) -> SinkFactory:
    """A factory of HttpSinks, numbering their generations."""
    return planned_factory(HttpSink, config, logger=logger)


def probe(config: HttpConfig, timeout: float) -> list[SinkProbe]:
    """Doctor: the receiver's host answers (TLS included), the secret is readable (probe.py)."""
    from cdc_relay.sink.http.probe import probe_http

    return probe_http(config, timeout)
