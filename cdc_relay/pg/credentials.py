"""Passwords that rotate: what a connection to PostgreSQL authenticates with, fetched per connection.

Owns the ``PasswordProvider`` protocol (``provider(target) -> password``, called by
pg/db.py just before every connection the relay opens, so a 15-minute token or a
rotated secret works for a relay that runs for months) and its two implementations:

* ``CommandPassword``: runs ``--password-command`` (through ``/bin/sh -c``); the first
  line of its standard output is the password. A command that fails, times out or
  prints nothing is ``AccessRefused`` (exit 6), one line that never shows its output.
* ``RdsIamToken``: an RDS/Aurora IAM authentication token for the connection's host,
  port and user, from a token function (boto3's ``generate_db_auth_token``, built by
  app/credentials.py; a fake one in the tests).

``require_tls`` refuses an IAM token over a connection that may be unencrypted.

It must not read the configuration or the environment (the provider is built from the
configuration by app/credentials.py and installed by the command, docs/design.md), log
a password, or import boto3.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from cdc_relay.errors import AccessRefused, ConfigError, mask_secrets
from cdc_relay.text import one_line, shorten

# sslmode values that encrypt the connection (libpq): an IAM token must not travel in clear.
TLS_SSLMODES = ("require", "verify-ca", "verify-full")
COMMAND_TIMEOUT = 30.0


@dataclass(frozen=True, slots=True)
class Target:
    """Where a connection goes: what a token is signed for (never the password)."""

    host: str
    port: int
    user: str


class PasswordProvider(Protocol):
    """Returns the password for one new connection to ``target``; raises a RelayError."""

    def __call__(self, target: Target) -> str: ...


class CommandPassword:
    """``--password-command``: the first line of the command's standard output, per connection."""

    def __init__(self, command: str, *, timeout: float = COMMAND_TIMEOUT) -> None:
        self._command = command
        self._timeout = timeout

    def __call__(self, target: Target) -> str:
        fix = "fix --password-command (it must print the password on its first line)"
        try:
            done = subprocess.run(  # the operator's own command line, through sh
                self._command, shell=True, capture_output=True, timeout=self._timeout,
                check=False, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as exc:
            raise AccessRefused(f"the password command did not finish within {self._timeout:g}s "
                                f"(connecting to {target.host}:{target.port}); {fix}") from exc
        except OSError as exc:
            raise AccessRefused(f"the password command could not be run: {exc.strerror}; "
                                f"{fix}") from exc
        if done.returncode != 0:
            # Its stderr says why (never its stdout: that may be the password).
            why = shorten(mask_secrets(one_line(done.stderr.decode(errors="replace"))), 200)
            raise AccessRefused(f"the password command failed (exit {done.returncode}"
                                f"{': ' + why if why else ''}); {fix}")
        lines = done.stdout.decode(errors="replace").splitlines()
        password = lines[0].strip("\r") if lines else ""
        if not password:
            raise AccessRefused(f"the password command printed no password; {fix}")
        return password


TokenFunction = Callable[[str, int, str, str], str]  # (host, port, user, region) -> token


class RdsIamToken:
    """``--aws-rds-iam``: a fresh IAM authentication token for each connection."""

    def __init__(self, token: TokenFunction, region: str) -> None:
        self._token = token
        self._region = region

    def __call__(self, target: Target) -> str:
        try:
            token = self._token(target.host, target.port, target.user, self._region)
        except Exception as exc:  # boto3's errors: credentials missing, a bad profile, ...
            raise AccessRefused(
                f"cannot make an RDS IAM token for {target.user}@{target.host}:{target.port} "
                f"(region {self._region}): {shorten(mask_secrets(one_line(str(exc))), 200)}. "
                "Fix: check the AWS credentials boto3 finds (AWS_PROFILE, the instance or "
                "task role) and that they allow rds-db:connect") from exc
        if not token:
            raise AccessRefused("the RDS IAM token function returned nothing; check the AWS "
                                "credentials boto3 finds")
        return token


def require_tls(sslmode: str | None) -> None:
    """Refuse an IAM token over a connection that may be unencrypted (exit 2, one line)."""
    if sslmode not in TLS_SSLMODES:
        raise ConfigError(
            f"--aws-rds-iam needs an encrypted connection, but sslmode is "
            f"{sslmode or 'prefer (the default)'}: add sslmode=verify-full (with sslrootcert "
            "set to the RDS CA bundle) or at least sslmode=require to --dsn")
