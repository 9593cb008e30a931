"""Doctor's output: the checks as aligned text lines with fixes, or as JSON.

Owns the report formats and the pass/fail summary. Must not decide verdicts (that is
``ops/doctor/checks.py``) nor gather anything.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict

import orjson

from cdc_relay.ops.verdicts import Check, Verdict


def failed(checks: Sequence[Check]) -> bool:
    return any(check.verdict is Verdict.FAIL for check in checks)


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
    return orjson.dumps([asdict(check) for check in checks], option=orjson.OPT_INDENT_2).decode()
