"""Type stub of the compiled replication reader (_cstream.c; docs/design.md)."""

from collections.abc import Callable

from cdc_relay.decoding.compiled import DecodeFunction
from cdc_relay.model import Change
from cdc_relay.wal.stream.protocol import ServerMessage

class Changes:
    """protocol.read_changes over ReplicationStream.read, in C: the next change, a
    keepalive, ``no_change`` for a message that decodes to nothing, None when nothing
    is buffered."""

    def __init__(self, get_copy_data: Callable[[int], tuple[int, memoryview | bytes]],
                 decode: DecodeFunction,
                 message: Callable[[int, memoryview], ServerMessage | None],
                 failed: Callable[[Exception], object], no_change: object) -> None: ...
    def __call__(self) -> Change | ServerMessage | object | None: ...
