"""Doctor's look at the Redis sink: the server answers, the credentials work, the keys are streams.

Reads only (PING, INFO server, TYPE, SCAN, CONFIG GET): the dead-letter stream's key must
be a stream or absent (XADD creates it); keys of ``--topic-pattern`` that exist must be
streams (another type makes their events dead letters); an eviction policy other than
``noeviction`` is a WARN (Redis may evict a stream, events and all, under memory
pressure), as is a CONFIG GET the user may not run. Must not: create or change anything.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from cdc_relay.errors import mask_secrets
from cdc_relay.sink.config import SinkProbe
from cdc_relay.sink.redis.client import ACL_FIX, make_client, refusal
from cdc_relay.sink.redis.config import RedisConfig


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def probe_redis(config: RedisConfig, timeout: float) -> list[SinkProbe]:
    """Doctor: Redis answers, the credentials work, the streams' keys hold streams."""
    client = make_client(replace(config, connect_timeout=min(config.connect_timeout, timeout),
                                 read_timeout=min(config.read_timeout, timeout)))
    try:
        client.ping()
        version = _text(client.info("server").get("redis_version", "?"))
    except Exception as exc:
        refused = refusal(exc, config.where)
        if refused is not None:
            return [SinkProbe("redis", False, str(refused), ACL_FIX)]
        return [SinkProbe("redis", False, f"cannot reach Redis at {config.where}: "
                          f"{mask_secrets(str(exc) or type(exc).__name__)}",
                          "check --brokers and that redis-server answers")]
    try:
        found = [SinkProbe("redis", True, f"Redis {version} at {config.where} answered"),
                 _key_probe(client, config.dead_letter_stream, "dead-letter stream"),
                 *_pattern_probes(client, config), _eviction_probe(client)]
    finally:
        client.close()
    return found


def _key_probe(client: Any, key: str, role: str) -> SinkProbe:
    kind = _text(client.type(key))
    if kind == "none":
        return SinkProbe(role, True, f"{key!r} does not exist yet: the first XADD creates it")
    if kind == "stream":
        return SinkProbe(role, True, f"{key!r} is a stream of {client.xlen(key)} entries")
    return SinkProbe(role, False, f"{key!r} holds a {kind}, not a stream: XADD to it fails",
                     f"rename or delete the key {key!r}, or choose another name")


def _pattern_probes(client: Any, config: RedisConfig) -> list[SinkProbe]:
    parts = re.split(r"\{[a-z_]+\}", config.topic_pattern)
    match = "*".join(p.replace("*", r"\*").replace("?", r"\?") for p in parts)
    keys = sorted(_text(k) for k in client.scan_iter(match=match, count=1000))[:20]
    if not keys:
        return [SinkProbe("streams", None, f"no key matches {config.topic_pattern!r} yet: the "
                          "first event of each aggregate type creates its stream")]
    return [_key_probe(client, key, "stream") for key in keys]


def _eviction_probe(client: Any) -> SinkProbe:
    try:
        policy = _text(client.config_get("maxmemory-policy").get("maxmemory-policy", "?"))
    except Exception as exc:
        return SinkProbe("eviction", None, f"cannot read maxmemory-policy ({exc}): not checked",
                         "grant +config|get to let doctor check it (the relay does not need it)")
    if policy == "noeviction":
        return SinkProbe("eviction", True, "maxmemory-policy noeviction: streams are never evicted")
    return SinkProbe("eviction", None, f"maxmemory-policy {policy}: Redis may evict a stream, "
                     "delivered events and all, when memory runs short",
                     "CONFIG SET maxmemory-policy noeviction (XADD then fails with OOM, "
                     "which the relay retries)")
