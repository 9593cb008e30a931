"""Type stub of the compiled pgoutput fast path (_cpgoutput.c; docs/design.md)."""

from cdc_relay.decoding.compiled import DecodeClass
from cdc_relay.model import Lsn, OutboxEvent

class Reader:
    """Reads the common Inserts of the outbox relations ``plans`` has a plan for."""

    def __init__(
        self,
        plans: dict[int, tuple[tuple[int, ...], int, int, tuple[tuple[int, int], ...]]],
        event_class: type[OutboxEvent],
    ) -> None:
        """``plans``: relation id -> (slots, ncols, nfields, aliases), the decoder's dict,
        read on every call; ``event_class``: cdc_relay.model.OutboxEvent (TypeError for a
        class whose fields are not exactly its fields, in its order)."""
    def insert(self, payload: bytes | bytearray | memoryview, wal_start: Lsn, /) -> OutboxEvent | None:
        """The OutboxEvent (``lsn`` = wal_start, attempt 1, created_at parsed, carried
        columns read) of an outbox Insert message, or None (the pure path decides)."""


# Decode(fast, slow, Lsn): the decoder's entry point (_coutbox.h; compiled.py says what it is).
Decode: DecodeClass
