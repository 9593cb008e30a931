"""Type stub of the compiled timestamp parse (_ctimestamp.c; docs/design.md)."""

def epoch_ms(text: str, /) -> int | None:
    """Epoch milliseconds (floor) of a PostgreSQL ISO timestamp text, or None: declined."""
