"""Settings of the HTTP sink: the URL template of ``--brokers`` and ``--sink-config`` parsed and checked.

Pure but for reading the signing secret (its file or its variable, once, at start-up: a
missing or empty one is a ConfigError, exit 2) and checking that named files exist: httpx
is not imported here, so the CLI can validate a command line before the client library
loads (docs/sinks.md, HTTP). Must not: do network I/O.
"""

from __future__ import annotations

import os
import re
import string
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from cdc_relay.errors import ConfigError, mask_secrets
from cdc_relay.sink.common import positive_float, positive_int, settings_of

PLACEHOLDERS = ("topic", "aggregate_type", "event_type", "aggregate_id")
# Headers every request carries besides the message's (docs/sinks.md, HTTP).
OWN_HEADERS = ("idempotency-key", "content-type", "aggregate_id", "timestamp",
               "x-cdc-relay-timestamp", "x-cdc-relay-signature", "host", "content-length")
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_KEYS = ("method", "batch_size", "concurrency", "max_per_host", "max_attempts", "max_in_flight",
         "max_retry_after", "connect_timeout", "read_timeout", "signing_secret_file",
         "signing_secret_env", "tls_ca_file", "tls_cert_file", "tls_key_file")


@dataclass(frozen=True, slots=True)
class HttpConfig:
    """The HTTP sink (docs/sinks.md): where to send, how, and how much may be unconfirmed."""

    url_template: str
    method: str = "POST"
    batch_size: int = 1  # events per request; 1: one request per event, its headers as HTTP headers
    concurrency: int = 8  # requests in flight at once, all hosts
    max_per_host: int = 4  # requests in flight at once to one host
    max_attempts: int = 3  # answers 4xx (not 408/429) before the event is a dead letter
    max_in_flight: int = 10_000
    max_retry_after: float = 60.0  # the longest Retry-After honoured, seconds
    message_timeout_ms: int = 30_000
    connect_timeout: float = 5.0
    read_timeout: float = 10.0
    signing_secret: bytes | None = field(default=None, repr=False)  # never in a log line
    tls_ca_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None

    @property
    def where(self) -> str:
        """The URL template, without a password."""
        return mask_secrets(self.url_template)


def header_problem(name: str) -> str | None:
    """Why ``name`` cannot be an HTTP header of the sink's requests, or None."""
    if not _TOKEN.fullmatch(name):
        return f"{name!r} is not a legal HTTP header name (letters, digits and !#$%&'*+.^_`|~-)"
    if name.lower() in OWN_HEADERS:
        return f"{name!r} is one of the HTTP sink's own headers"
    return None


def check_template(template: str) -> None:
    """The URL template is http(s) with a host, and names only known placeholders."""
    parts = urlsplit(template.replace("{", "").replace("}", ""))
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"invalid --brokers {mask_secrets(template)!r} for the http sink: "
                          "expected a URL template such as https://HOST/hooks/{aggregate_type}")
    if "{" in urlsplit(template).netloc:
        raise ConfigError(f"--brokers {mask_secrets(template)!r}: placeholders may stand in the "
                          "path and query only, not in the host")
    try:
        names = [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]
    except ValueError as exc:
        raise ConfigError(f"invalid URL template {mask_secrets(template)!r}: {exc}") from exc
    for name in names:
        if name not in PLACEHOLDERS:
            raise ConfigError(f"unknown placeholder {{{name}}} in the URL template: use "
                              + ", ".join("{" + p + "}" for p in PLACEHOLDERS))


def parse_http(brokers: str, items: Iterable[str], *, header_names: Sequence[str] = (),
               message_timeout_ms: int = 30_000) -> HttpConfig:
    """The HTTP config of ``--brokers URL_TEMPLATE`` and ``--sink-config``."""
    template = brokers.strip()
    check_template(template)
    s = settings_of(items, _KEYS, "http")
    method = s.get("method", "POST").upper()
    if method not in ("POST", "PUT"):
        raise ConfigError(f"invalid --sink-config method={s['method']!r}: expected POST or PUT")
    if "signing_secret_file" in s and "signing_secret_env" in s:
        raise ConfigError("give the signing secret once: signing_secret_file or signing_secret_env")
    for name in header_names:
        problem = header_problem(name)
        if problem is not None:
            raise ConfigError(f"invalid --header name for the http sink: {problem}; rename it "
                              "with COLUMN:NAME")
    if s.get("tls_key_file") and not s.get("tls_cert_file"):
        raise ConfigError("--sink-config tls_key_file needs tls_cert_file (the client certificate)")
    return HttpConfig(
        url_template=template, method=method,
        batch_size=positive_int(s, "batch_size", 1),
        concurrency=positive_int(s, "concurrency", 8),
        max_per_host=positive_int(s, "max_per_host", 4),
        max_attempts=positive_int(s, "max_attempts", 3),
        max_in_flight=positive_int(s, "max_in_flight", 10_000),
        max_retry_after=positive_float(s, "max_retry_after", 60.0),
        message_timeout_ms=message_timeout_ms,
        connect_timeout=positive_float(s, "connect_timeout", 5.0),
        read_timeout=positive_float(s, "read_timeout", 10.0),
        signing_secret=read_secret(s.get("signing_secret_file"), s.get("signing_secret_env")),
        tls_ca_file=s.get("tls_ca_file"), tls_cert_file=s.get("tls_cert_file"),
        tls_key_file=s.get("tls_key_file"),
    )


def read_secret(path: str | None, variable: str | None) -> bytes | None:
    """The signing secret from its file or variable (a trailing newline dropped), or None."""
    if path:
        try:
            text = Path(path).read_bytes()
        except OSError as exc:
            raise ConfigError(f"cannot read --sink-config signing_secret_file={path}: "
                              f"{exc.strerror}") from exc
    elif variable:
        value = os.environ.get(variable)
        if not value:
            raise ConfigError(f"--sink-config signing_secret_env={variable}: the variable is not "
                              "set (or empty); export the secret in it")
        text = value.encode()
    else:
        return None
    secret = text.rstrip(b"\r\n")
    if not secret:
        raise ConfigError("the signing secret is empty: put the secret in its file or variable")
    return secret
