"""The schema registry refusing the relay's credentials: exit 6, at start-up and mid-run.

Owns telling an access refusal (HTTP 401, 403) from other registry trouble and the line
it ends the relay with (docs/messages.md, schema registry; docs/design.md, the
retry-or-exit policy: what waiting cannot fix is one line with the fix and
``AccessRefused``, exit 6). ``probe`` asks the registry once when a producer warms up, so
a wrong password stops the relay before the first event instead of at the first event
type it has not seen: 401 there is AccessRefused; an unreachable registry, or a 403 on
listing subjects (a user allowed to register but not to list), is left to the events,
which wait. ``refusal`` turns registry trouble met while encoding (a 401 or 403 under the
encoder's RegistryTrouble) into AccessRefused.

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
    fix = ("check basic.auth.user.info=USER:PASSWORD (or bearer.auth.*) in "
           "--schema-registry-config" if status == 401 else
           "grant this user read and write on the subjects (or the registry's developer role)")
    return mask_secrets(f"schema registry {config.url} refused access (HTTP {status}{words}; "
                        f"{given}). Fix: {fix}; retrying cannot fix this")


def refusal(config: RegistryConfig, exc: BaseException) -> AccessRefused | None:
    """AccessRefused when ``exc`` (registry trouble while encoding) was caused by a 401/403."""
    cause = exc.__cause__
    if isinstance(cause, SchemaRegistryError) and cause.http_status_code in REFUSALS:
        return AccessRefused(refused_line(config, cause.http_status_code, str(cause.error_message)))
    return None


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
