"""Types of the compiled fast path of the wal2json decoder (_cwal2json.c)."""

def row(
    payload: bytes | bytearray | memoryview,
    schema: str,
    table: str,
    names: tuple[str, str, str, str, str, str],
    plan: tuple[int, int, int, int, int, int],
    timestamped: bool,
    /,
) -> tuple[str, str, str, str, bytes, str | None, int] | None:
    """The common outbox insert of one wal2json v2 message, or None (see _cwal2json.c)."""
