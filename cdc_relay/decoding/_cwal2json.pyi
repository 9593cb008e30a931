"""Types of the compiled fast path of the wal2json decoder (_cwal2json.c)."""

from cdc_relay.decoding.compiled import DecodeClass
from cdc_relay.model import Lsn, OutboxEvent

class Reader:
    """Reads one outbox table's common wal2json v2 inserts (see _cwal2json.c)."""

    def __init__(
        self,
        schema: str,
        table: str,
        names: tuple[str, str, str, str, str, str],
        timestamped: bool,
        extras: tuple[str, ...],
        trace: tuple[str, str],
        event_class: type[OutboxEvent],
    ) -> None:
        """``event_class``: cdc_relay.model.OutboxEvent (TypeError for a class whose
        fields are not exactly its fields, in its order)."""
    def row(
        self,
        payload: bytes | bytearray | memoryview,
        wal_start: Lsn,
        plan: tuple[int, int, int, int, int, int] = ...,
        carried: tuple[int, ...] = ...,
        ncols: int = ...,
        /,
    ) -> OutboxEvent | None:
        """The OutboxEvent (``lsn`` = wal_start, attempt 1, created_at parsed, the extras
        and trace context read) of a common insert of the table with ``ncols`` columns, or
        None for anything else. ``plan``: the six mapped columns' positions; ``carried``:
        the positions of the extras and the trace columns (-1: absent), or () for none
        (decoding/carried.py's plan); ``ncols``: the column count both plans are for (-1:
        none yet). Without the three: the ones last given (here or to set_plan), None
        before any."""
    def set_plan(self, plan: tuple[int, int, int, int, int, int], carried: tuple[int, ...],
                 ncols: int, /) -> None:
        """The plans ``row(payload, wal_start)`` reads by, as row's last three arguments."""


# Decode(fast, slow, Lsn): the decoder's entry point (_coutbox.h; compiled.py says what it is).
Decode: DecodeClass
