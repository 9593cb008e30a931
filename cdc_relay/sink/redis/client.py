"""The redis-py client of the redis sink and how its errors read (sink/redis/sink.py, probe.py).

Owns building the client from ``RedisConfig`` (timeouts, TLS) and which errors are a
refusal of the credentials or permissions (``AccessRefused``, exit 6, with the ACL fix).
Must not send anything.
"""

from __future__ import annotations

from typing import Any

import redis
import redis.exceptions

from cdc_relay.errors import AccessRefused, mask_secrets
from cdc_relay.sink.redis.config import RedisConfig

_REFUSED = ("NOAUTH", "WRONGPASS", "NOPERM", "invalid password", "invalid username")
ACL_FIX = ("give the relay's user +xadd +ping on the streams' keys (ACL SETUSER relay on >PASSWORD "
           "~outbox.* +xadd +ping), and check the user and password in --brokers")


def make_client(config: RedisConfig) -> Any:
    """A redis-py client for the config (no I/O until the first command)."""
    options: dict[str, Any] = {"socket_connect_timeout": config.connect_timeout,
                               "socket_timeout": config.read_timeout,
                               "health_check_interval": 30,
                               "client_name": "cdc-relay"}
    if config.url.startswith("rediss://"):
        options.update(ssl_ca_certs=config.tls_ca_file, ssl_certfile=config.tls_cert_file,
                       ssl_keyfile=config.tls_key_file)
    return redis.Redis.from_url(config.url, **options)


def refusal(exc: BaseException, where: str) -> AccessRefused | None:
    """AccessRefused when ``exc`` says Redis refused the credentials or a permission."""
    text = str(exc)
    if isinstance(exc, redis.exceptions.AuthenticationError | redis.exceptions.NoPermissionError) or (
            isinstance(exc, redis.exceptions.ResponseError) and any(w in text for w in _REFUSED)):
        return AccessRefused(f"Redis at {where} refused the relay: {mask_secrets(text)}; {ACL_FIX}")
    return None
