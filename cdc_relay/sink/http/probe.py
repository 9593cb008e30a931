"""Doctor's look at the HTTP sink: the receiver's host answers (TLS included), the secret is readable.

Sends one ``OPTIONS`` request to the template's origin (scheme, host and port; a request
HTTP defines as safe, so no event is posted): any answer means the host is reachable and
its certificate trusted; a refused connection, a timeout or a TLS failure is a FAIL with
the fix (a signing secret that cannot be read stopped doctor before, exit 2). Must not:
post anything.
"""

from __future__ import annotations

from dataclasses import replace
from urllib.parse import urlsplit

import httpx

from cdc_relay.errors import mask_secrets
from cdc_relay.sink.config import SinkProbe
from cdc_relay.sink.http.client import make_client
from cdc_relay.sink.http.config import HttpConfig


def probe_http(config: HttpConfig, timeout: float) -> list[SinkProbe]:
    """Doctor: the receiver's origin answers (and the signing secret was read)."""
    found: list[SinkProbe] = []
    if config.signing_secret is not None:
        found.append(SinkProbe("signing secret", True, f"read ({len(config.signing_secret)} bytes)"))
    parts = urlsplit(config.url_template.split("{", 1)[0])
    origin = f"{parts.scheme}://{parts.netloc}/"
    client = make_client(replace(config, connect_timeout=min(config.connect_timeout, timeout),
                                 read_timeout=min(config.read_timeout, timeout)))
    try:
        answer = client.request("OPTIONS", origin)
    except httpx.ConnectError as exc:
        tls = "CERTIFICATE" in str(exc).upper() or "SSL" in str(exc).upper()
        fix = ("trust the receiver's CA: --sink-config tls_ca_file=CA.pem" if tls
               else "check --brokers and that the receiver listens")
        return [SinkProbe("http", False, f"cannot connect to {mask_secrets(origin)}: {exc}", fix),
                *found]
    except httpx.HTTPError as exc:
        return [SinkProbe("http", False, f"{mask_secrets(origin)} did not answer: "
                          f"{type(exc).__name__} {exc}", "check --brokers and the network"),
                *found]
    finally:
        client.close()
    return [SinkProbe("http", True, f"{mask_secrets(origin)} answered OPTIONS with "
                      f"{answer.status_code}"), *found]
