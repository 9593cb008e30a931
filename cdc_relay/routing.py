"""Routing: turn an OutboxEvent into the Message both relay modes publish (docs/design.md).

This module owns the message contract, so WAL mode and polling mode emit identical
messages: the topic from ``--topic-pattern``, the key (``aggregate_id``, so one
aggregate stays on one partition, in order), the value (the payload), both serialized
by ``--message-format`` (cdc_relay/formats.py), the headers ``id`` / ``event_type`` /
``aggregate_type`` plus the ``--header`` columns and the W3C ``traceparent`` /
``tracestate`` when the event has them, the partition when ``--partition-column`` names
one (else the producer's partitioner hashes the serialized key) and the timestamp
(``created_at`` in epoch ms). It also builds the dead-letter form of a message.

It is pure and on the hot path: two dict lookups per event (aggregate_type, then
event_type) find the formatted, validated topic and the two header tuples of the pair;
only the key, the id header and the Message itself are built per event. Where the
compiled router is built (decoding/_croute.c) and the configuration is the plain one
(the raw format, no ``--header`` or ``--partition-column``), ``route`` is its C
function, which builds that same Message for the common event and hands every other one
to the Python route (docs/design.md, "The compiled router"). The CloudEvents formats
(cdc_relay/cloudevents.py: more headers, or an envelope, per event) are never compiled.

It must not do I/O or decide what happens to a bad event. An event whose topic is not a
legal Kafka topic name raises RoutingError; the loops turn that into a dead letter and
go on, never into a crash (docs/design.md). Configuration that can only ever produce illegal
topics (a bad dead-letter topic, a pattern with illegal literal characters) is a
ConfigError at construction instead, so it fails at start-up, not per event.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from collections.abc import Callable

from cdc_relay import accel
from cdc_relay.cloudevents import FORMATS as CLOUDEVENTS_FORMATS
from cdc_relay.cloudevents import CloudEventsFormat
from cdc_relay.config import RouterConfig, TableRef
from cdc_relay.errors import ConfigError
from cdc_relay.formats import key_encoder, raw_values, value_encoder
from cdc_relay.model import Message, OutboxEvent
from cdc_relay.text import shorten

MAX_TOPIC_LENGTH = 249  # Kafka's limit (the broker keeps 255 for partition directories)
_LEGAL_TOPIC = re.compile(r"[a-zA-Z0-9._-]+")
_ILLEGAL_CHAR = re.compile(r"[^a-zA-Z0-9._-]")

# Distinct (aggregate_type, event_type) pairs are few in practice; the bound only guards
# against a producer of unbounded event types. When full, the cache starts over.
_CACHE_LIMIT = 4096
# Keep dead-letter headers readable when a reason quotes something huge.
_MAX_REASON_CHARS = 1000


class RoutingError(Exception):
    """The event cannot be routed (e.g. its topic name is illegal): dead-letter it.

    ``reason`` says why, ``topic`` is the offending topic name when one was computed.
    """

    def __init__(self, reason: str, topic: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.topic = topic


def topic_problem(name: str) -> str | None:
    """Return why ``name`` is not a legal Kafka topic name, or None if it is one.

    Kafka's rules: 1 to 249 characters from ``[a-zA-Z0-9._-]``, and not ``.`` or ``..``.
    """
    if not name:
        return "the topic name is empty"
    if len(name) > MAX_TOPIC_LENGTH:
        return (
            f"topic name {shorten(name, 60)!r} is {len(name)} characters long "
            f"(Kafka allows at most {MAX_TOPIC_LENGTH})"
        )
    if name in (".", ".."):
        return f"topic name {name!r} is reserved"
    if not _LEGAL_TOPIC.fullmatch(name):
        illegal = "".join(sorted(set(_ILLEGAL_CHAR.findall(name))))
        return (
            f"topic name {name!r} contains {illegal!r}: Kafka allows only letters, digits, "
            "'.', '_' and '-'"
        )
    return None


# One cache entry: topic, problem (None if legal), and the event_type and aggregate_type
# headers, ready to go into every message's header list (tuples: shared, never changed).
_Header = tuple[str, bytes]
_Route = tuple[str, str | None, _Header, _Header]


# The configurations the compiled router knows (an allow-list, docs/design.md, "The compiled
# router"): RouterConfig's fields it reads nothing of (any value: the Python route fills the
# cache it reads), and the one value each other field may have. A field or a value not
# listed here - a new message format, a new option - takes the Python route.
_C_ROUTER_ANY = frozenset({"topic_pattern", "dead_letter_topic",
                           "cloudevents_source"})  # only the CloudEvents formats read it
_C_ROUTER_ONLY: dict[str, object] = {"message_format": "raw", "header_columns": (),
                                     "partition_column": None}


def compiled_router_applies(config: RouterConfig) -> bool:
    """Whether the compiled router builds what the Python route would for ``config``: only
    for the exact RouterConfig class and the fields and values it knows."""
    if type(config) is not RouterConfig:
        return False
    for field in dataclasses.fields(config):
        if field.name in _C_ROUTER_ANY:
            continue
        if field.name not in _C_ROUTER_ONLY or getattr(config, field.name) != _C_ROUTER_ONLY[
                field.name]:
            return False
    return True


class Router:
    """Route outbox events to Kafka messages; build dead letters (see the module docstring).

    ``table`` fills the ``{schema}`` and ``{table}`` placeholders of the pattern
    (default ``public.outbox_events``). Raises ConfigError if the dead-letter topic is
    illegal or the pattern can never produce a legal topic. The compiled router is used
    where it is built, the process's choice allows it (accel.py) and it knows the
    configuration (``compiled_router_applies``). ``database`` fills the ``{database}`` of
    the CloudEvents formats' source (cdc_relay/cloudevents.py).
    """

    def __init__(self, config: RouterConfig, table: TableRef | None = None, *,
                 database: str = "postgres") -> None:
        table = table if table is not None else TableRef()
        self._config = config
        self._pattern = config.topic_pattern
        self._schema = table.schema
        self._table = table.name
        self._dead_letter_topic = config.dead_letter_topic
        # aggregate_type -> event_type -> route: two lookups of strs whose hashes are
        # cached, where one lookup of a (str, str) key would build and hash a tuple.
        self._cache: dict[str, dict[str, _Route]] = {}
        self._cached = 0
        self._key = key_encoder(config.message_format)
        self._value = value_encoder(config.message_format)
        self._raw_values = raw_values(config.message_format)  # per event: no call when raw
        extra = config.extra_columns()
        # (position in OutboxEvent.extra, header name) per --header; the partition's position.
        self._header_slots = tuple(
            (extra.index(column), name) for column, name in config.header_columns
        )
        self._partition_slot = (
            extra.index(config.partition_column) if config.partition_column is not None else -1
        )
        self._partition_column = config.partition_column
        self._cloudevents: CloudEventsFormat | None = None
        if config.message_format in CLOUDEVENTS_FORMATS:
            source = config.cloudevents_source.format(database=database, schema=table.schema,
                                                      table=table.name)
            self._cloudevents = CloudEventsFormat(
                source, structured=config.message_format == "cloudevents-structured")

        problem = topic_problem(config.dead_letter_topic)
        if problem is not None:
            raise ConfigError(f"invalid dead-letter topic: {problem}")
        # With every placeholder replaced by "x", an illegal result means the pattern's
        # literal text (or the table name) makes every topic illegal.
        problem = topic_problem(self._format("x", "x"))
        if problem is not None:
            raise ConfigError(
                f"invalid topic pattern {config.topic_pattern!r}: {problem} "
                "(e.g. use outbox.event.{aggregate_type})"
            )
        # ``route``: the compiled router where it applies (the module docstring), else _route.
        self.route: Callable[[OutboxEvent], Message] = self._route
        if compiled_router_applies(config):
            module = accel.extension("_croute")
            if module is not None:
                self.route = module.Route(self._cache, self._route, OutboxEvent, Message).route

    @property
    def compiled(self) -> bool:
        """True when ``route`` is the compiled router's."""
        return self.route != self._route

    @property
    def config(self) -> RouterConfig:
        """The configuration this router was built from."""
        return self._config

    def _route(self, event: OutboxEvent) -> Message:
        """Return the message for ``event``; raise RoutingError if it has no legal topic.

        Also RoutingError (so a dead letter, never a crash) for text that cannot be
        serialized (lone surrogates, a payload that is not UTF-8) and for a partition
        column value that is not a non-negative integer. (``route``: this, or the
        compiled router, which gives the same answers.)
        """
        by_event_type = self._cache.get(event.aggregate_type)
        entry = None if by_event_type is None else by_event_type.get(event.event_type)
        if entry is None:
            entry = self._resolve(event.aggregate_type, event.event_type)
        topic, problem, event_type, aggregate_type = entry
        if problem is not None:
            raise RoutingError(problem, topic)
        try:
            key = self._key(event.aggregate_id)
            value = event.payload if self._raw_values else self._value(event.payload)
            event_id = event.id.encode()
        except ValueError as exc:  # lone surrogates, or a payload that is not UTF-8
            raise RoutingError(f"event {event.id!r} is not valid UTF-8: {exc}", topic) from exc
        headers = [("id", event_id), event_type, aggregate_type]
        partition = None
        if event.extra:
            self._add_column_headers(event, headers)
            if self._partition_slot >= 0:
                partition = self._partition(event, topic)
        if event.traceparent is not None:
            headers.append(("traceparent", _encode(event.traceparent)))
            if event.tracestate is not None:
                headers.append(("tracestate", _encode(event.tracestate)))
        if self._cloudevents is not None:
            value = self._cloud_event(self._cloudevents, event, headers, topic)
        return Message(topic, key, value, headers, event.created_at_ms, partition)

    @staticmethod
    def _cloud_event(shape: CloudEventsFormat, event: OutboxEvent,
                     headers: list[tuple[str, bytes]], topic: str) -> bytes:
        """Add the CloudEvents attributes to ``headers``; return the value (cloudevents.py)."""
        try:
            return shape.apply(event, headers)
        except ValueError as exc:  # lone surrogates, or a payload that is not UTF-8
            raise RoutingError(f"event {event.id!r} is not valid UTF-8: {exc}", topic) from exc

    def _add_column_headers(self, event: OutboxEvent, headers: list[tuple[str, bytes]]) -> None:
        extra = event.extra
        for slot, name in self._header_slots:
            text = extra[slot] if slot < len(extra) else None
            if text is not None:  # NULL: no header, as Debezium's additional placement
                headers.append((name, _encode(text)))

    def _partition(self, event: OutboxEvent, topic: str) -> int | None:
        extra = event.extra
        text = extra[self._partition_slot] if self._partition_slot < len(extra) else None
        if text is None:
            return None  # NULL: the partitioner decides, from the key
        try:
            partition = int(text)
        except ValueError:
            partition = -1
        if partition < 0:
            raise RoutingError(
                f"column {self._partition_column!r} of event {event.id!r} is {text!r}: "
                "--partition-column needs a non-negative integer",
                topic,
            )
        return partition

    def dead_letter(self, item: Message | OutboxEvent, reason: str) -> Message:
        """Return the dead-letter message for a message (or an event that could not be routed).

        A captured table's message (a Message) keeps its own topic as ``original_topic``.

        Key, value and timestamp are unchanged; the headers are the original ones plus
        ``error`` (the reason) and ``original_topic``. Never raises: undecodable text is
        replaced rather than failing the dead letter too.
        """
        key: bytes | None
        value: bytes | None
        if isinstance(item, OutboxEvent):
            original_topic: str = self._format(item.aggregate_type, item.event_type)
            try:  # serialized as the routed message would be, so a replay sends the same bytes
                key, value = self._key(item.aggregate_id), self._value(item.payload)
            except ValueError:
                key, value = _encode(item.aggregate_id), item.payload
            headers = [
                ("id", _encode(item.id)),
                ("event_type", _encode(item.event_type)),
                ("aggregate_type", _encode(item.aggregate_type)),
            ]
            if item.extra:
                self._add_column_headers(item, headers)
            if item.traceparent is not None:
                headers.append(("traceparent", _encode(item.traceparent)))
                if item.tracestate is not None:
                    headers.append(("tracestate", _encode(item.tracestate)))
            if self._cloudevents is not None:
                with contextlib.suppress(RoutingError):  # else: the plain form, as above
                    attributes: list[tuple[str, bytes]] = []
                    value = self._cloud_event(self._cloudevents, item, attributes, original_topic)
                    headers += attributes
            timestamp_ms = item.created_at_ms
        else:
            original_topic = item.topic
            key, value, headers = item.key, item.value, list(item.headers)
            timestamp_ms = item.timestamp_ms
        headers.append(("error", _encode(shorten(reason, _MAX_REASON_CHARS))))
        headers.append(("original_topic", _encode(original_topic)))
        return Message(self._dead_letter_topic, key, value, headers, timestamp_ms)

    def _format(self, aggregate_type: str, event_type: str) -> str:
        return self._pattern.format(
            aggregate_type=aggregate_type,
            event_type=event_type,
            schema=self._schema,
            table=self._table,
        )

    def _resolve(self, aggregate_type: str, event_type: str) -> _Route:
        topic = self._format(aggregate_type, event_type)
        entry: _Route = (
            topic,
            topic_problem(topic),
            ("event_type", _encode(event_type)),
            ("aggregate_type", _encode(aggregate_type)),
        )
        if self._cached >= _CACHE_LIMIT:
            self._cache.clear()  # in place: the compiled router reads this dict
            self._cached = 0
        self._cache.setdefault(aggregate_type, {})[event_type] = entry
        self._cached += 1
        return entry


def _encode(text: str) -> bytes:
    return text.encode("utf-8", "replace")
