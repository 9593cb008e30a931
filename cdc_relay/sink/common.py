"""Small parsing helpers the settings of the Redis, HTTP and Kinesis sinks share.

Pure: no client library, no I/O but checking that a named file exists. Each raises
ConfigError naming the ``--sink-config`` key and what it expects.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from cdc_relay.config import parse_producer_config
from cdc_relay.errors import ConfigError

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def settings_of(items: Iterable[str], known: Iterable[str], sink: str) -> dict[str, str]:
    """``KEY=VALUE`` items as a dict; an unknown key or a missing ``*_file`` is a ConfigError."""
    settings = parse_producer_config(list(items))
    allowed = set(known)
    for key, value in settings.items():
        if key not in allowed:
            raise ConfigError(f"unknown --sink-config key {key!r} for the {sink} sink: use one of "
                              + ", ".join(sorted(allowed)) + " (see docs/sinks.md)")
        if key.endswith("_file") and not os.path.isfile(value):
            raise ConfigError(f"--sink-config {key}={value!r}: no such file")
    return settings


def positive_int(settings: dict[str, str], key: str, default: int, *, zero: bool = False) -> int:
    """``settings[key]`` as a positive integer (or 0 when ``zero``), else ``default``."""
    value = settings.get(key, str(default))
    try:
        number = int(value)
    except ValueError:
        number = -1
    if number < (0 if zero else 1):
        raise ConfigError(f"invalid --sink-config {key}={value!r}: expected a "
                          + ("non-negative" if zero else "positive") + " integer")
    return number


def positive_float(settings: dict[str, str], key: str, default: float) -> float:
    """``settings[key]`` as a positive number of seconds, else ``default``."""
    value = settings.get(key, str(default))
    try:
        number = float(value)
    except ValueError:
        number = 0.0
    if not number > 0:
        raise ConfigError(f"invalid --sink-config {key}={value!r}: expected a positive number "
                          "of seconds")
    return number


def flag(settings: dict[str, str], key: str, default: bool) -> bool:
    """``settings[key]`` as true/false, else ``default``."""
    value = settings.get(key)
    if value is None:
        return default
    if value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    raise ConfigError(f"invalid --sink-config {key}={value!r}: expected true or false")
