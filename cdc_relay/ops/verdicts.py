"""What a check says: ``Check`` (one line of a report) and its ``Verdict``.

Shared by the checks of ``doctor`` (ops/doctor/) and of failover readiness
(ops/failover/checks.py, which ``doctor --standby-dsn`` and ``status`` show), so neither
room imports the other's. Must not: decide anything, do I/O.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from cdc_relay.errors import ExitCode


class Verdict(enum.Enum):
    PASS = "pass"
    WARN = "warn"
    FAIL = "fail"
    SKIP = "skip"


@dataclass(frozen=True, slots=True)
class Check:
    """One line of doctor's report; ``fix`` says what to run when it is not a pass.
    ``exit_code``: what a FAIL means beyond a failed check - UNAVAILABLE (a service could
    not be reached), REFUSED (it refused the credentials); None: FAILURE."""

    name: str
    verdict: Verdict
    detail: str
    fix: str | None = None
    exit_code: ExitCode | None = None
