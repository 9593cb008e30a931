"""One relay Message as an HTTP request, a batch of them as one, and the signature scheme.

Pure (no httpx, no I/O), unit-tested on its own (docs/sinks.md, HTTP):

* URL = the ``--brokers`` template with ``{topic}`` (the topic pattern's result; the
  dead-letter topic for a dead letter), ``{aggregate_type}``, ``{event_type}`` and
  ``{aggregate_id}`` filled in, each percent-encoded;
* one event per request: body = the value bytes the Kafka sink sends; headers = the
  message's headers (``id``, ``event_type``, ``aggregate_type``, trace context,
  ``--header`` columns, a dead letter's ``error`` and ``original_topic``), plus
  ``aggregate_id``, ``timestamp`` (epoch ms), ``Idempotency-Key`` (the event id) and
  ``Content-Type`` (the message's ``content-type`` header, else ``application/json``); a
  value that is not printable ASCII is percent-encoded (RFC 3986, UTF-8);
* a batch: body = a JSON array of envelopes (sink/envelope.py), ``Idempotency-Key`` =
  ``sha256:`` and the hash of the events' ids joined by ``,``;
* with a signing secret: ``X-Cdc-Relay-Timestamp: T`` (unix seconds) and
  ``X-Cdc-Relay-Signature: v1=HEX``, HEX = hex(HMAC-SHA256(secret, T + "." + body)).

Must not: decide what an answer means for the event (sink/http/sink.py does).
"""

from __future__ import annotations

import hashlib
import hmac
import re
from email.utils import parsedate_to_datetime
from urllib.parse import quote

from cdc_relay.model import Message
from cdc_relay.sink.envelope import envelope_object, envelopes

_PRINTABLE = re.compile(r"[\x20-\x7e]*")


def header_value(value: bytes) -> str:
    """A header's bytes as an HTTP header value: printable ASCII as is, else percent-encoded."""
    text = value.decode("utf-8", "replace")
    if _PRINTABLE.fullmatch(text):
        return text
    return quote(text, safe=" !\"#$&'()*+,/:;<=>?@[\\]^`{|}~")


def _header(message: Message, name: str) -> str:
    for key, value in reversed(message.headers):
        if key == name:
            return value.decode("utf-8", "replace")
    return ""


def url_of(template: str, message: Message) -> str:
    """The request URL of ``message`` (module docstring)."""
    values = {"topic": message.topic, "aggregate_type": _header(message, "aggregate_type"),
              "event_type": _header(message, "event_type"),
              "aggregate_id": (message.key or b"").decode("utf-8", "replace")}
    return template.format(**{k: quote(v, safe="") for k, v in values.items()})


def single(message: Message) -> tuple[bytes, dict[str, str]]:
    """Body and headers of a request carrying one event."""
    headers = {name: header_value(value) for name, value in message.headers
               if name != "content-type"}
    headers["aggregate_id"] = header_value(message.key or b"")
    if message.timestamp_ms is not None:
        headers["timestamp"] = str(message.timestamp_ms)
    event_id = headers.get("id")
    if event_id:
        headers["Idempotency-Key"] = event_id
    headers["Content-Type"] = _header(message, "content-type") or "application/json"
    return message.value or b"", headers


def batch(messages: list[Message]) -> tuple[bytes, dict[str, str]]:
    """Body and headers of a request carrying several events (a JSON array of envelopes)."""
    ids = ",".join(_header(m, "id") for m in messages)
    return envelopes([envelope_object(m) for m in messages]), {
        "Content-Type": "application/json",
        "Idempotency-Key": "sha256:" + hashlib.sha256(ids.encode()).hexdigest()}


def signature(secret: bytes, timestamp: int, body: bytes) -> str:
    """``v1=`` and hex(HMAC-SHA256(secret, "TIMESTAMP." + body)): X-Cdc-Relay-Signature."""
    digest = hmac.new(secret, str(timestamp).encode() + b"." + body, hashlib.sha256).hexdigest()
    return f"v1={digest}"


def signed(headers: dict[str, str], secret: bytes | None, timestamp: int,
           body: bytes) -> dict[str, str]:
    """``headers`` plus the signature headers when there is a secret."""
    if secret is None:
        return headers
    return {**headers, "X-Cdc-Relay-Timestamp": str(timestamp),
            "X-Cdc-Relay-Signature": signature(secret, timestamp, body)}


def retry_after(value: str | None, now_epoch: float, cap: float) -> float | None:
    """Seconds to wait from a Retry-After header (seconds or an HTTP date), at most ``cap``."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return min(float(value), cap)
    try:
        when = parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError):
        return None
    return min(max(0.0, when - now_epoch), cap)
