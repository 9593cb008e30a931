"""The type modes of captured tables: Debezium's properties that change how a type is written.

Owns ``TypeModes``, the frozen choice of ``decimal.handling.mode``,
``time.precision.mode``, ``interval.handling.mode``, ``binary.handling.mode``,
``hstore.handling.mode`` and ``money.fraction.digits`` (``run --capture-decimal-handling``
and its siblings, docs/table-cdc.md, type modes), with their allowed values, and the two
conversion several types share: a byte string under ``binary.handling.mode``. The mappings that use them are
capture/types.py's, capture/numeric.py's and capture/special.py's.

Pure; must not do I/O or read the environment (cdc_relay/config.py gives the values).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

__all__ = ["DECIMAL_MODES", "TIME_MODES", "TypeModes", "binary_schema", "binary_value"]

DECIMAL_MODES = ("precise", "string", "double")
TIME_MODES = ("adaptive", "adaptive_time_microseconds", "connect")
INTERVAL_MODES = ("numeric", "string")
BINARY_MODES = ("bytes", "base64", "base64-url-safe", "hex")
HSTORE_MODES = ("json", "map")


@dataclass(frozen=True, slots=True)
class TypeModes:
    """Debezium's type-mode properties, its defaults by default (see the module docstring)."""

    decimal: str = "precise"
    time: str = "adaptive"
    interval: str = "numeric"
    binary: str = "bytes"
    hstore: str = "json"
    money_digits: int = 2

    def __post_init__(self) -> None:
        for value, allowed, flag in (
                (self.decimal, DECIMAL_MODES, "decimal-handling"),
                (self.time, TIME_MODES, "time-precision"),
                (self.interval, INTERVAL_MODES, "interval-handling"),
                (self.binary, BINARY_MODES, "binary-handling"),
                (self.hstore, HSTORE_MODES, "hstore-handling")):
            if value not in allowed:
                raise ValueError(f"--capture-{flag} {value!r} is not one of "
                                 f"{', '.join(allowed)} (as Debezium's)")
        if not 0 <= self.money_digits <= 20:
            raise ValueError(f"--capture-money-fraction-digits {self.money_digits} is not "
                             "between 0 and 20")


def binary_value(data: bytes, mode: str) -> str:
    """``data`` as the JSON payload has it under ``binary.handling.mode`` ``mode`` (``bytes``:
    base64, as JsonConverter writes a bytes schema)."""
    if mode == "hex":
        return data.hex()
    if mode == "base64-url-safe":
        return base64.urlsafe_b64encode(data).decode()
    return base64.b64encode(data).decode()


def binary_schema(mode: str) -> dict[str, Any]:
    """The schema of a ``bytea`` column under ``binary.handling.mode`` ``mode``."""
    return {"type": "bytes" if mode == "bytes" else "string"}
