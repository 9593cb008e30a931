"""Small parsing helpers the settings of the Redis, HTTP, Kinesis and SQS sinks share.

Pure: no client library, no I/O but checking that a named file exists. Each raises
ConfigError naming the ``--sink-config`` key and what it expects.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from urllib.parse import urlsplit

from cdc_relay.config import parse_producer_config
from cdc_relay.errors import ConfigError, mask_secrets

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
_REGION = re.compile(r"[a-z]{2}(-[a-z0-9]+)+-[0-9]+")


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


def aws_address(brokers: str, scheme: str) -> tuple[str | None, str | None]:
    """An AWS sink's ``--brokers``: (endpoint URL, None) or, for ``SCHEME://REGION``, (None, region)."""
    address = brokers.strip()
    parts = urlsplit(address)
    if parts.scheme == scheme and parts.netloc and _REGION.fullmatch(parts.netloc):
        return None, parts.netloc
    if parts.scheme in ("http", "https") and parts.hostname:
        return address, None
    raise ConfigError(f"invalid --brokers {mask_secrets(address)!r} for the {scheme} sink: expected "
                      f"{scheme}://REGION (e.g. {scheme}://eu-west-1) or an endpoint URL "
                      "http[s]://HOST[:PORT]")


def aws_region(settings: dict[str, str], region: str | None, scheme: str) -> str | None:
    """The region of ``--sink-config region=`` and ``SCHEME://REGION`` (given once)."""
    if "region" not in settings:
        return region
    if not _REGION.fullmatch(settings["region"]):
        raise ConfigError(f"invalid --sink-config region={settings['region']!r}: expected an AWS "
                          "region such as eu-west-1")
    if region is not None and settings["region"] != region:
        raise ConfigError(f"--brokers {scheme}://{region} and --sink-config region="
                          f"{settings['region']} disagree: give the region once")
    return settings["region"]
