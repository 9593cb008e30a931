"""A throwaway Apache Kafka with SASL_SSL, SCRAM-SHA-512 and ACLs, for the security tests.

Owns the throwaway TLS material (a CA and a server certificate for 127.0.0.1, made with
``cryptography`` in the broker's own temp dir), the server properties that secure a
single-node KRaft broker (cdc_relay.local.apache_kafka), and the librdkafka settings a
client of its SASL_SSL listener needs. Users and ACLs are made by a client library once
the broker runs (tests/integration/security_support.py): SCRAM credentials live in the
cluster metadata, so they cannot be part of the storage template every broker copies.

The listeners, and why:

* ``SASL_SSL`` (its own port): the only one the relay's users connect to; TLS from the
  throwaway CA, SCRAM-SHA-512 logins.
* ``PLAINTEXT`` (``port``): the inter-broker listener and the readiness probe's
  (ApacheKafka's raw Metadata request), and the administrator's: its principal is
  ``User:ANONYMOUS``, a super user, because a single node's broker talks to itself over
  it (transaction markers, the controller's metadata) and a PLAINTEXT principal cannot be
  told apart from any other. It binds to 127.0.0.1 only; a test that checks an ACL must
  connect through SASL_SSL.
* ``CONTROLLER``: PLAINTEXT on 127.0.0.1, as in every local broker.

ACLs: KRaft's ``StandardAuthorizer`` with ``allow.everyone.if.no.acl.found=false``, so a
user may do exactly what its ACLs grant; ``User:admin`` (a SCRAM user) and
``User:ANONYMOUS`` are super users.

Must not: import the relay's drivers (no confluent_kafka here), touch a process it did
not start.
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from cdc_relay.local.apache_kafka import DEFAULT_VERSION, ApacheKafka
from cdc_relay.local.helpers import HOST, free_port

SASL_LISTENER = "SASL_SSL"
MECHANISM = "SCRAM-SHA-512"
ADMIN_USER = "admin"
SUPER_USERS = (f"User:{ADMIN_USER}", "User:ANONYMOUS")
AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
_VALID = datetime.timedelta(days=2)


@dataclass(frozen=True)
class TlsFiles:
    """PEM files: the CA's certificate (clients trust it) and the server's keystore (its
    unencrypted PKCS#8 key, then its certificate: ``ssl.keystore.type=PEM``)."""

    ca: Path
    keystore: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def make_tls(directory: Path, host: str = HOST) -> TlsFiles:
    """A fresh CA and a server certificate for ``host`` (an IP SAN, and ``localhost``)
    signed by it, written under ``directory``. EC P-256: quick to make, as OpenSSL and
    the JVM both accept it."""
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=5)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (x509.CertificateBuilder().subject_name(_name("cdc-relay test CA"))
               .issuer_name(_name("cdc-relay test CA")).public_key(ca_key.public_key())
               .serial_number(x509.random_serial_number()).not_valid_before(now)
               .not_valid_after(now + _VALID)
               .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
               .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                            content_commitment=False, key_encipherment=False,
                                            data_encipherment=False, key_agreement=False,
                                            encipher_only=False, decipher_only=False), critical=True)
               .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(_name(host)).issuer_name(ca_cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now).not_valid_after(now + _VALID)
            .add_extension(x509.SubjectAlternativeName([
                x509.IPAddress(ipaddress.ip_address(host)), x509.DNSName("localhost")]),
                critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .sign(ca_key, hashes.SHA256()))
    files = TlsFiles(ca=directory / "ca.pem", keystore=directory / "server.pem")
    files.ca.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    files.keystore.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                          serialization.NoEncryption())
        + cert.public_bytes(serialization.Encoding.PEM) + ca_cert.public_bytes(serialization.Encoding.PEM))
    files.keystore.chmod(0o600)
    return files


def secured_properties(tls: TlsFiles, super_users: tuple[str, ...] = SUPER_USERS) -> dict[str, str]:
    """The server properties of the SASL_SSL listener, SCRAM-SHA-512 and the authorizer
    (module docstring); the listener itself is ApacheKafka's ``listeners``."""
    prefix = f"listener.name.{SASL_LISTENER.lower()}."
    return {
        # Named explicitly once a listener beyond PLAINTEXT and CONTROLLER exists.
        "listener.security.protocol.map":
            f"PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,{SASL_LISTENER}:{SASL_LISTENER}",
        "sasl.enabled.mechanisms": MECHANISM,
        f"{prefix}{MECHANISM.lower()}.sasl.jaas.config":
            "org.apache.kafka.common.security.scram.ScramLoginModule required;",
        f"{prefix}ssl.keystore.type": "PEM",
        f"{prefix}ssl.keystore.location": str(tls.keystore),
        "authorizer.class.name": AUTHORIZER,
        "super.users": ";".join(super_users),
        "allow.everyone.if.no.acl.found": "false",
    }


def client_config(tls: TlsFiles, user: str, password: str) -> dict[str, str]:
    """librdkafka settings of a client of the SASL_SSL listener, logging in as ``user``."""
    return {
        "security.protocol": SASL_LISTENER,
        "sasl.mechanism": MECHANISM,
        "sasl.username": user,
        "sasl.password": password,
        "ssl.ca.location": str(tls.ca),
    }


class SecuredKafka(ApacheKafka):
    """An ApacheKafka with a SASL_SSL listener on ``sasl_port`` and ACLs (module docstring).

    ``bootstrap`` stays the PLAINTEXT listener (super user ANONYMOUS: the administrator's);
    clients under test use ``sasl_bootstrap`` with ``client_config``. The TLS material is
    made in the broker's temp dir at the first start and kept by ``restart()``.
    """

    def __init__(self, version: str = DEFAULT_VERSION, *, sasl_port: int | None = None,
                 extra: Mapping[str, str] | None = None, fast_start: bool = True) -> None:
        self.sasl_port = free_port() if sasl_port is None else sasl_port
        super().__init__(version, extra=extra, listeners={SASL_LISTENER: self.sasl_port},
                         fast_start=fast_start)
        self._user_extra = dict(extra or {})
        self._tls: TlsFiles | None = None

    @property
    def sasl_bootstrap(self) -> str:
        return f"{self.host}:{self.sasl_port}"

    @property
    def tls(self) -> TlsFiles:
        if self._tls is None:
            raise RuntimeError(f"{self.name} has no TLS material yet: call start()")
        return self._tls

    def client_config(self, user: str, password: str) -> dict[str, str]:
        """``bootstrap.servers`` and the security settings of ``user`` on SASL_SSL."""
        return {"bootstrap.servers": self.sasl_bootstrap, **client_config(self.tls, user, password)}

    def _prepare(self, tmp: Path) -> None:
        super()._prepare(tmp)
        if self._tls is None:
            self._tls = make_tls(tmp / "tls")
            self._extra = {**secured_properties(self._tls), **self._user_extra}
