"""Doctor's output: the checks as aligned text lines with fixes, or as JSON.

Owns the report formats, the pass/fail summary and the exit code the checks give. Must
not decide verdicts (that is ``ops/doctor/checks.py`` and ``slot_checks.py``) nor gather
anything.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict

import orjson

from cdc_relay.errors import ExitCode
from cdc_relay.ops.verdicts import Check, Verdict


def failed(checks: Sequence[Check]) -> bool:
    return any(check.verdict is Verdict.FAIL for check in checks)


def exit_code(checks: Sequence[Check]) -> ExitCode:
    """doctor's exit code (docs/operations.md, exit codes): that of the first failed check
    that names one (UNAVAILABLE: a service could not be reached; REFUSED), else FAILURE
    when a check failed, else OK."""
    named = [c.exit_code for c in checks if c.verdict is Verdict.FAIL and c.exit_code]
    return named[0] if named else ExitCode.FAILURE if failed(checks) else ExitCode.OK


def format_checks(checks: Sequence[Check]) -> str:
    """``PASS  name  detail`` lines, a ``fix:`` line under each non-pass, a summary."""
    width = max(len(check.name) for check in checks)
    lines = []
    for check in checks:
        lines.append(f"{check.verdict.value.upper():4}  {check.name.ljust(width)}  {check.detail}")
        if check.fix and check.verdict in (Verdict.FAIL, Verdict.WARN):
            lines.append(f"{'':4}  {'':{width}}  fix: {check.fix}")
    counts = {v: sum(c.verdict is v for c in checks) for v in Verdict}
    lines.append(f"doctor: {counts[Verdict.PASS]} passed, {counts[Verdict.WARN]} warning(s), "
                 f"{counts[Verdict.FAIL]} failed, {counts[Verdict.SKIP]} skipped")
    return "\n".join(lines)


def format_checks_json(checks: Sequence[Check]) -> str:
    """The checks as a JSON array of {name, verdict, detail, fix}."""
    rows = [{k: v for k, v in asdict(check).items() if k != "exit_code"} for check in checks]
    return orjson.dumps(rows, option=orjson.OPT_INDENT_2).decode()
