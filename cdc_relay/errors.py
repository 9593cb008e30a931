"""The RelayError hierarchy and the process exit codes.

Every error a user can see derives from RelayError, is defined here, and carries a
message that names the cause and the fix. The CLI maps each class to an exit code;
nothing here prints. Driver exceptions are wrapped (``raise ... from exc``) at the edge
that caught them. An exception that never leaves the loop that catches it (control flow:
a producer to replace, a Kafka transaction to replay, a full queue) stays beside the code
that raises and catches it (docs/design.md, errors).
"""

from __future__ import annotations

import enum
import re


class ExitCode(enum.IntEnum):
    """Named process exit codes (``cdc-relay`` returns one of these)."""

    OK = 0
    FAILURE = 1  # an unexpected internal error, or a failed check (doctor)
    USAGE = 2  # bad option, malformed value, invalid identifier, bad config file
    UNAVAILABLE = 3  # PostgreSQL or the broker cannot be reached / refused us
    DATA = 4  # a change could not be decoded, or its schema was refused: stopped without confirming past it
    DEAD_LETTER_REFUSED = 5  # the dead-letter topic refused an event: stopped before it
    REFUSED = 6  # PostgreSQL or the broker refused us: credentials, privileges, a missing role attribute
    SLOT_LOST = 7  # the replication slot the relay created is gone or invalidated: recovery needed
    INTERRUPTED = 130  # a second signal: stopped at once


class RelayError(Exception):
    """Base of every error the relay reports to a user."""

    exit_code: ExitCode = ExitCode.FAILURE


class ConfigError(RelayError):
    """A value given by the user (flag, env var, config file) is invalid."""

    exit_code = ExitCode.USAGE


class WrongEndpoint(ConfigError):
    """--dsn reaches a server that cannot do what the command needs: a connection pooler
    where a replication connection is needed, a read-only node where writes are.

    A retry cannot fix it: the line names the endpoint to use instead (exit 2).
    """


class ServiceUnavailable(RelayError):
    """PostgreSQL or the broker could not be reached, or refused the connection."""

    exit_code = ExitCode.UNAVAILABLE


class SourceLost(ServiceUnavailable):
    """The replication connection failed or closed; resume from the slot after a backoff."""


class DatabaseError(ServiceUnavailable):
    """PostgreSQL reported an error that stops the command."""


class BrokerError(ServiceUnavailable):
    """The broker (or the producer talking to it) failed in a way the command cannot fix."""


class AccessRefused(RelayError):
    """PostgreSQL or the broker refused the relay's credentials or privileges.

    Retrying cannot fix it (wrong password, a role without REPLICATION or a table
    privilege, a broker ACL): one line with the GRANT or setting that fixes it, exit 6,
    the same at start-up and mid-run (docs/design.md, the retry-or-exit policy).
    """

    exit_code = ExitCode.REFUSED


class SlotLost(RelayError):
    """The replication slot this relay created is missing or invalidated (a slot loss).

    Events committed since its last confirmed position may never have been relayed, so the
    relay never silently creates a fresh slot: it stops (exit 7) with the recovery command,
    or recovers by itself when configured to (docs/design.md, continuity).
    """

    exit_code = ExitCode.SLOT_LOST


class SlotBusy(DatabaseError):
    """The replication slot is in use by another process (SQLSTATE 55006)."""


class DecodeError(RelayError):
    """A replication message could not be decoded. Fatal: never skip and confirm past it."""

    exit_code = ExitCode.DATA


class SchemaRefused(RelayError):
    """The schema registry refused a captured table's new schema (its compatibility rule).

    Waiting cannot make the schema compatible and skipping the change would confirm past
    it: WAL mode stops (exit 4, refused data) with the table, the columns and the rule.
    """

    exit_code = ExitCode.DATA


class DeadLetterRefused(RelayError):
    """The dead-letter topic refused an event that its own topic refused too.

    Nothing can deliver the event, and skipping it would confirm past it; replaying would
    repeat the same refusal for ever. WAL mode stops with this error (exit code 5).
    """

    exit_code = ExitCode.DEAD_LETTER_REFUSED


class LocalServiceError(RelayError):
    """A throwaway local PostgreSQL or broker (tests, demo, benchmarks) could not start."""


class CheckpointMismatch(ConfigError):
    """Exactly-once: the checkpoint topic holds this slot's checkpoint for another PostgreSQL cluster."""


class CheckpointCorrupt(RelayError):
    """Exactly-once: a checkpoint record for this source cannot be read."""


class DemoError(RelayError):
    """The demo could not run to its end (a service or the relay failed)."""


_PASSWORD_PATTERNS = (
    # key=value DSN: password=secret or password='sec ret'
    re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE),
    # URL DSN: postgresql://user:secret@host
    re.compile(r"(://[^:/@\s]*:)([^@\s]*)(@)"),
    # librdkafka secrets: sasl.password=..., ssl.key.password=...
    re.compile(r"((?:sasl\.password|ssl\.key\.password|ssl\.keystore\.password)\s*[=:]\s*)(\S+)",
               re.IGNORECASE),
)


def mask_secrets(text: str) -> str:
    """Replace passwords in DSNs and producer settings with ``***``.

    Applied to every message and log line the relay emits, so a DSN quoted in an error
    from libpq or in a log line never shows its password.
    """
    text = _PASSWORD_PATTERNS[0].sub(r"\1***", text)
    text = _PASSWORD_PATTERNS[1].sub(r"\1***\3", text)
    return _PASSWORD_PATTERNS[2].sub(r"\1***", text)
