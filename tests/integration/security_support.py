"""The security tests' side of a secured Apache Kafka (cdc_relay.local.kafka_security):
SCRAM users and ACLs made by its administrator, and the relay's SASL_SSL options.

The administrator connects through the broker's PLAINTEXT listener (its principal,
``User:ANONYMOUS``, is a super user); users under test through SASL_SSL only.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from cdc_relay.local.kafka_security import SecuredKafka
from tests.support import wait_for

TIMEOUT = 30.0


@dataclass(frozen=True)
class Acl:
    """One ALLOW ACL for a user: ``operation`` on ``resource`` ``name`` (LITERAL or PREFIXED)."""

    operation: str  # WRITE, READ, DESCRIBE, CREATE, IDEMPOTENT_WRITE, ...
    resource: str  # TOPIC, GROUP, TRANSACTIONAL_ID, CLUSTER
    name: str
    pattern: str = "LITERAL"

    def binding(self, user: str) -> AclBinding:
        return AclBinding(ResourceType[self.resource], self.name, ResourcePatternType[self.pattern],
                          f"User:{user}", "*", AclOperation[self.operation], AclPermissionType.ALLOW)

    def __str__(self) -> str:
        pattern = " (prefixed)" if self.pattern == "PREFIXED" else ""
        return f"{self.operation} on {self.resource} {self.name}{pattern}"


class Admin:
    """The broker's administrator: users and ACLs, over PLAINTEXT (a super user)."""

    def __init__(self, kafka: SecuredKafka) -> None:
        self.kafka = kafka
        self._client = AdminClient({"bootstrap.servers": kafka.bootstrap})

    def new_user(self) -> tuple[str, str]:
        """A fresh SCRAM-SHA-512 user with no ACL: (name, password)."""
        user, password = f"u{uuid.uuid4().hex[:10]}", f"pw-{uuid.uuid4().hex}"
        upsert = UserScramCredentialUpsertion(
            user, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), password.encode())
        for future in self._client.alter_user_scram_credentials([upsert]).values():
            future.result(TIMEOUT)
        return user, password

    def grant(self, user: str, acls: list[Acl]) -> None:
        """Create the ACLs, and wait until the broker's authorizer lists them: KRaft applies
        a committed ACL asynchronously, and a client started at once may still be refused."""
        if acls:
            bindings = [acl.binding(user) for acl in acls]
            for future in self._client.create_acls(bindings, request_timeout=TIMEOUT).values():
                future.result(TIMEOUT)
            wait_for(lambda: set(bindings) <= self._listed(user), timeout=TIMEOUT,
                     message=f"the ACLs of {user} in force")

    def _listed(self, user: str) -> set[Any]:
        any_acl = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, f"User:{user}",
                                   None, AclOperation.ANY, AclPermissionType.ANY)
        return set(self._client.describe_acls(any_acl, request_timeout=TIMEOUT).result(TIMEOUT))

    def revoke_all(self, user: str) -> None:
        any_acl = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, f"User:{user}",
                                   None, AclOperation.ANY, AclPermissionType.ANY)
        for future in self._client.delete_acls([any_acl], request_timeout=TIMEOUT).values():
            future.result(TIMEOUT)

    def create_topics(self, *names: str, config: dict[str, str] | None = None) -> None:
        futures = self._client.create_topics([NewTopic(name, 1, 1, config=config or {})
                                              for name in names], request_timeout=TIMEOUT)
        for future in futures.values():
            future.result(TIMEOUT)


def producer_config_options(kafka: SecuredKafka, user: str, password: str) -> tuple[str, ...]:
    """The relay's ``--producer-config`` options for ``user`` on the SASL_SSL listener."""
    config = kafka.client_config(user, password)
    config.pop("bootstrap.servers")
    return tuple(arg for key, value in config.items() for arg in ("--producer-config", f"{key}={value}"))
