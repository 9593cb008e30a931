"""What a check says: ``Check`` (one line of a report) and its ``Verdict``.

Shared by the checks of ``doctor`` (ops/doctor/) and of failover readiness
(ops/failover/checks.py, which ``doctor --standby-dsn`` and ``status`` show), so neither
room imports the other's. Must not: decide anything, do I/O.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Verdict(enum.Enum):
    PASS = "pass"
    WARN = "warn"
    FAIL = "fail"
    SKIP = "skip"


@dataclass(frozen=True, slots=True)
class Check:
    """One line of doctor's report; ``fix`` says what to run when it is not a pass."""

    name: str
    verdict: Verdict
    detail: str
    fix: str | None = None
