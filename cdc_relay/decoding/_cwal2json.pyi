"""Types of the compiled fast path of the wal2json decoder (_cwal2json.c)."""

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
    ) -> None: ...
    def row(
        self,
        payload: bytes | bytearray | memoryview,
        plan: tuple[int, int, int, int, int, int],
        carried: tuple[int, ...],
        /,
    ) -> (
        tuple[str, str, str, str, bytes, str | None, int, tuple[str | None, ...], str | None,
              str | None]
        | None
    ):
        """(id, aggregate_type, aggregate_id, event_type, payload, created_at text or None,
        column count, extras' texts, traceparent, tracestate) of a common insert of the
        table, or None for anything else. ``carried``: the positions of the extras and the
        trace columns (-1: absent), or () for none (decoding/carried.py's plan)."""
