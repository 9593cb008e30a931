"""The schema registry refusing the relay: a login is exit 6, a permission waits.

Owns telling an access refusal (HTTP 401, 403) from other registry trouble and its line
(docs/messages.md, schema registry), by the rules the broker follows (docs/design.md, the
retry-or-exit policy; docs/operations.md, exit codes): refused credentials (401) cannot be
fixed by waiting - one line with the fix and ``AccessRefused``, exit 6, as a Kafka SASL
login; a user who may not use one subject (403) is like a missing topic WRITE ACL - the
event waits, one line naming the grant, until the registry's admin grants it.

``probe`` asks the registry once when a producer warms up, so a wrong password stops the
relay before the first event instead of at the first event type it has not seen; an
unreachable registry or a 403 there is left to the events. ``refusal`` turns registry
trouble met while encoding into AccessRefused (401) or the waiting line (403).

Must not: log secrets (the URL is masked), retry, or produce.
"""

from __future__ import annotations

from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError

from cdc_relay.config import RegistryConfig
from cdc_relay.errors import AccessRefused, mask_secrets

REFUSALS = (401, 403)


def refused_line(config: RegistryConfig, status: int, said: str) -> str:
    """The one line of an access refusal: the registry, the status, the fix."""
    settings = " ".join(sorted(k for k in config.client_config if k.startswith(("basic.", "bearer."))))
    given = f"the relay sent {settings}" if settings else "the relay sent no credentials"
    words = "" if said.startswith("Unknown Schema Registry Error") else f": {said[:200]}"
    if status == 401:
        return mask_secrets(f"schema registry {config.url} refused the relay's credentials (HTTP "
                            f"401{words}; {given}). Fix: check basic.auth.user.info=USER:PASSWORD "
                            "(or bearer.auth.*) in --schema-registry-config; retrying cannot "
                            "fix this")
    return mask_secrets(f"schema registry {config.url} does not let this user use the subject "
                        f"(HTTP {status}{words}; {given}). Fix: grant it read and write on the "
                        "subject (or the registry's developer role); the event waits")


def refusal(config: RegistryConfig, exc: BaseException) -> AccessRefused | str | None:
    """For registry trouble met while encoding (``exc``): AccessRefused when a 401 caused
    it, the waiting line when a 403 did, else None."""
    cause = exc.__cause__
    if not isinstance(cause, SchemaRegistryError) or cause.http_status_code not in REFUSALS:
        return None
    line = refused_line(config, cause.http_status_code, str(cause.error_message))
    return AccessRefused(line) if cause.http_status_code == 401 else line


def probe(config: RegistryConfig, client: SchemaRegistryClient) -> None:
    """One request (the subject list): AccessRefused on 401; anything else is left to the
    events (they wait while the registry is unreachable)."""
    try:
        client.get_subjects()
    except SchemaRegistryError as exc:
        if exc.http_status_code == 401:
            raise AccessRefused(refused_line(config, 401, str(exc.error_message))) from exc
    except Exception:  # unreachable, TLS trouble, timeouts: the events wait and say so
        return
