"""The import of an optional compiled fast path (docs/design.md, "The compiled decoders").

Owns: what a ``compiled`` setting means for one extension module (this package's, or
cdc_relay.sink's delivery reports): None imports it when it is built, False never, True
requires it (ImportError naming it).

Must not: build anything, or hide an ImportError that ``compiled=True`` asked to see.
"""

from __future__ import annotations

import importlib
from types import ModuleType


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
