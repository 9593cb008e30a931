"""The httpx client of the http sink (sink/http/sink.py, probe.py).

Owns building the client from ``HttpConfig``: timeouts, TLS with a CA file and an
optional client certificate, no redirects followed, connections for ``concurrency``
requests, no proxy settings from the environment. Must not send anything.
"""

from __future__ import annotations

import ssl

import httpx

from cdc_relay.sink.http.config import HttpConfig


def make_client(config: HttpConfig) -> httpx.Client:
    """An httpx client for the config (no I/O until the first request)."""
    verify: ssl.SSLContext | bool = True
    if config.tls_ca_file or config.tls_cert_file:
        context = ssl.create_default_context(cafile=config.tls_ca_file)
        if config.tls_cert_file:
            context.load_cert_chain(config.tls_cert_file, config.tls_key_file)
        verify = context
    return httpx.Client(
        verify=verify, follow_redirects=False, trust_env=False,
        timeout=httpx.Timeout(config.read_timeout, connect=config.connect_timeout),
        limits=httpx.Limits(max_connections=config.concurrency,
                            max_keepalive_connections=config.concurrency),
        headers={"User-Agent": "cdc-relay"})
