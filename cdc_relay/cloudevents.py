"""CloudEvents 1.0 message formats (docs/messages.md, "CloudEvents").

Owns the two ``--message-format`` values that wrap an outbox event as a CloudEvent,
following the CloudEvents Kafka protocol binding (the same attributes travel as headers
on RabbitMQ and NATS):

* ``cloudevents`` - binary content mode: the value is the payload as is; the attributes
  are headers ``ce_specversion`` (``1.0``), ``ce_id`` (the event id), ``ce_source``,
  ``ce_type`` (event_type), ``ce_subject`` (aggregate_id), ``ce_time`` (created_at, RFC
  3339 in UTC with milliseconds), ``ce_traceparent`` / ``ce_tracestate`` (the
  distributed tracing extension, when the event has a trace context) and
  ``content-type: application/json`` (datacontenttype).
* ``cloudevents-structured`` - structured content mode: the value is the JSON envelope
  ``{"specversion", "id", "source", "type", "subject", "time", "datacontenttype",
  "traceparent", "tracestate", "data": <the payload JSON>}`` and ``content-type`` is
  ``application/cloudevents+json``.

In both the key stays the aggregate id (the binding's partition key) and the message
contract's own headers (``id``, ``event_type``, ``aggregate_type``, ``--header`` columns,
the W3C ``traceparent`` / ``tracestate``) come first, so dedup and tracing work as with
the other formats. ``source`` comes from ``--cloudevents-source``, a template whose
``{database}``, ``{schema}`` and ``{table}`` the router fills once; by default
``/cdc-relay/{database}/{schema}.{table}``.

Pure; must not do I/O. The compiled router never builds these messages (routing.py
uses it only for the raw format). Text with no UTF-8 form raises ValueError; the router
turns that into a dead letter.
"""

from __future__ import annotations

import functools
import time

from cdc_relay.formats import json_string
from cdc_relay.model import OutboxEvent

SPEC_VERSION = b"1.0"
FORMATS = ("cloudevents", "cloudevents-structured")
DEFAULT_SOURCE = "/cdc-relay/{database}/{schema}.{table}"
SOURCE_FIELDS = ("database", "schema", "table")
DATA_CONTENT_TYPE = "application/json"
STRUCTURED_CONTENT_TYPE = b"application/cloudevents+json"

Headers = list[tuple[str, bytes]]


def rfc3339(epoch_ms: int) -> str:
    """Epoch milliseconds as RFC 3339 UTC with milliseconds: ``2026-12-03T10:00:00.123Z``."""
    seconds, millis = divmod(epoch_ms, 1000)
    return _utc_second(seconds) + f".{millis:03d}Z"


@functools.lru_cache(maxsize=256)
def _utc_second(seconds: int) -> str:
    # Events arrive in bursts within the same second: strftime once per second, not per event.
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))


class CloudEventsFormat:
    """Adds an event's CloudEvents attributes to its message (see the module docstring)."""

    def __init__(self, source: str, *, structured: bool) -> None:
        self._source = source
        self._source_bytes = source.encode()
        self._source_json = json_string(source)
        self._structured = structured

    @property
    def source(self) -> str:
        """The ``source`` attribute of every event."""
        return self._source

    def apply(self, event: OutboxEvent, headers: Headers) -> bytes:
        """Append the attributes to ``headers`` and return the message value."""
        if self._structured:
            headers.append(("content-type", STRUCTURED_CONTENT_TYPE))
            return self._envelope(event)
        headers += [
            ("ce_specversion", SPEC_VERSION),
            ("ce_id", event.id.encode()),
            ("ce_source", self._source_bytes),
            ("ce_type", event.event_type.encode()),
            ("ce_subject", event.aggregate_id.encode()),
        ]
        if event.created_at_ms is not None:
            headers.append(("ce_time", rfc3339(event.created_at_ms).encode()))
        if event.traceparent is not None:
            headers.append(("ce_traceparent", event.traceparent.encode()))
            if event.tracestate is not None:
                headers.append(("ce_tracestate", event.tracestate.encode()))
        headers.append(("content-type", DATA_CONTENT_TYPE.encode()))
        return event.payload

    def _envelope(self, event: OutboxEvent) -> bytes:
        event.payload.decode()  # ValueError (a dead letter) for a payload that is not UTF-8
        parts = [
            b'{"specversion":"1.0","id":' + json_string(event.id),
            b'"source":' + self._source_json,
            b'"type":' + json_string(event.event_type),
            b'"subject":' + json_string(event.aggregate_id),
        ]
        if event.created_at_ms is not None:
            parts.append(b'"time":"' + rfc3339(event.created_at_ms).encode() + b'"')
        parts.append(b'"datacontenttype":"' + DATA_CONTENT_TYPE.encode() + b'"')
        if event.traceparent is not None:
            parts.append(b'"traceparent":' + json_string(event.traceparent))
            if event.tracestate is not None:
                parts.append(b'"tracestate":' + json_string(event.tracestate))
        parts.append(b'"data":' + event.payload + b"}")
        return b",".join(parts)
