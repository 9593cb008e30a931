"""Type stub of the compiled pgoutput fast path (_cpgoutput.c; docs/design.md)."""

from typing import Any

def insert(
    payload: bytes | bytearray | memoryview,
    plans: dict[int, tuple[tuple[int, ...], int, int, tuple[tuple[int, int], ...]]],
    /,
) -> tuple[Any, ...] | None: ...
