"""Type stub of the compiled router (_croute.c; docs/design.md, "The compiled decoders")."""

from collections.abc import Callable

from cdc_relay.model import Message, OutboxEvent

class Route:
    """The Router's per-event common case, built in C."""

    def __init__(
        self,
        cache: dict[str, dict[str, tuple[str, str | None, tuple[str, bytes], tuple[str, bytes]]]],
        fallback: Callable[[OutboxEvent], Message],
        event_class: type[OutboxEvent],
        message_class: type[Message],
    ) -> None:
        """``cache``: the Router's, read on every call (aggregate_type -> event_type ->
        (topic, problem, event_type header, aggregate_type header)); ``fallback``: the
        Python route, for every event but the plain case; the two classes:
        cdc_relay.model's OutboxEvent and Message (TypeError for any other)."""
    def route(self, event: OutboxEvent, /) -> Message:
        """The Message of ``event``, exactly as ``fallback`` builds it; ``fallback``'s
        answer (or exception) for everything but the plain case."""
