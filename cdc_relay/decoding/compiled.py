"""The import of an optional compiled fast path (docs/design.md, "The compiled decoders").

Owns: what a ``compiled`` setting means for one extension module (this package's, or
cdc_relay.sink's delivery reports): None imports it when it is built, False never, True
requires it (ImportError naming it).

Must not: build anything, or hide an ImportError that ``compiled=True`` asked to see.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType
from typing import Protocol

from cdc_relay.model import Change, Lsn, OutboxEvent

# A decoder's decode(payload, wal_start): wal_start an int or an Lsn.
DecodeFunction = Callable[[bytes | memoryview, int], Change | None]


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


def compiled_extension(name: str, what: str, compiled: bool | None, *,
                       package: str = "cdc_relay.decoding") -> ModuleType | None:
    """``<package>.<name>`` per the ``compiled`` setting, or None (pure path)."""
    if compiled is False:
        return None
    try:
        return importlib.import_module(f"{package}.{name}")
    except ImportError as exc:
        if compiled:
            raise ImportError(
                f"the compiled {what} ({package}.{name}) is not built: reinstall "
                "cdc-relay where a C compiler and the Python headers are available"
            ) from exc
        return None
