"""The types of the compiled decoders' entry point (docs/design.md, "The compiled decoders").

Owns: ``DecodeFunction`` (a decoder's decode), the shape of the ``Decode`` class both
compiled decoder modules export, and ``position_lsn``: the pure decoders' check of the
position, worded as ``Decode``'s, so both paths refuse a non-int one alike. Which path
runs is cdc_relay/accel.py's choice.

Must not: import an extension (accel.py does), or hold any state.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from cdc_relay.model import Change, Lsn, OutboxEvent

# A decoder's decode(payload, wal_start): wal_start an int or an Lsn.
DecodeFunction = Callable[[bytes | memoryview, int], Change | None]


def position_lsn(position: object) -> Lsn:
    """``position`` as an Lsn; TypeError, as ``Decode`` raises it, unless it is an int
    (an Lsn, or a bool: int subclasses both). ``1.0`` and ``"1"`` are refused, never
    converted: a position is the stream's, never parsed or rounded."""
    if type(position) is Lsn:
        return position
    if not isinstance(position, int):
        raise TypeError(f"decode: the position must be an int, not {type(position).__name__}")
    return Lsn(position)


class CompiledDecode(Protocol):
    """A compiled module's ``Decode(fast, slow, Lsn)`` (decoding/_coutbox.h): the decoder's
    entry point, ``fast(payload, lsn)`` first and ``slow(payload, lsn)`` when it declines."""

    @property
    def position(self) -> Lsn:
        """The last non-zero position it was called with (0/0 before the first)."""

    def __call__(self, payload: bytes | memoryview, wal_start: int, /) -> Change | None: ...


# The class both compiled decoder modules export as ``Decode``: Decode(fast, slow,
# lsn_class), ``fast(payload, lsn)`` the Reader's (the event, or None), ``slow`` the pure
# decoder, ``lsn_class`` cdc_relay.model.Lsn (TypeError for an int subclass with fields).
DecodeClass = Callable[
    [Callable[[bytes | memoryview, Lsn], OutboxEvent | None],
     Callable[[bytes | memoryview, Lsn], Change | None], type[Lsn]],
    CompiledDecode]
