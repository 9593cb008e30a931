"""``doctor --capture``: the checks of table CDC, from gathered facts (pure).

Owns what is judged for the tables ``run --capture`` will stream: that they exist, their
replica identity (UPDATE and DELETE fail on a published table without one), the SELECT
privilege (snapshots need it), and whether the publication covers them and publishes
updates and deletes - or, if not, whether the relay's role may make it so at start-up
(it must own the tables). Values in, Checks out, each failure with its fix.
The facts are gathered by ops/doctor/gather_capture.py. Imports no driver.
"""

from __future__ import annotations

from dataclasses import dataclass

from cdc_relay.capture.shape import TableShape, identity_problem
from cdc_relay.ops.verdicts import Check, Verdict


@dataclass(frozen=True, slots=True)
class CaptureFacts:
    """What doctor found of the captured tables. ``error``: why the tables could not be
    listed (a missing table, nothing matched); ``coverage`` None: no such publication,
    else (publishes updates and deletes, the ``schema.table`` names it includes, ``*`` for
    all tables)."""

    option: str
    publication: str
    shapes: tuple[TableShape, ...] = ()
    no_select: tuple[str, ...] = ()
    not_owned: tuple[str, ...] = ()
    coverage: tuple[bool, frozenset[str]] | None = None
    error: str | None = None
    plugin: str = "pgoutput"  # wal2json: no publication (the slot's add-tables)


def capture_checks(facts: CaptureFacts) -> list[Check]:
    """The tables, their replica identity, the SELECT privilege, the publication."""
    if facts.error is not None:
        return [Check("captured tables", Verdict.FAIL, facts.error,
                      "create the tables or correct --capture (schema.table or schema.*)")]
    names = [shape.qualified for shape in facts.shapes]
    return [Check("captured tables", Verdict.PASS, f"{len(names)}: {', '.join(names)}"),
            _identity_check(facts), _select_check(facts), _publication_check(facts)]


def _identity_check(facts: CaptureFacts) -> Check:
    problems = [p for p in (identity_problem(shape, facts.plugin) for shape in facts.shapes) if p]
    if problems:
        fixes = [p.split(" Fix: ", 1) for p in problems]
        return Check("replica identity", Verdict.FAIL, "; ".join(f[0] for f in fixes),
                     "; ".join(f[1] for f in fixes if len(f) > 1))
    return Check("replica identity", Verdict.PASS,
                 "every captured table has a key or REPLICA IDENTITY FULL/INDEX")


def _select_check(facts: CaptureFacts) -> Check:
    if facts.no_select:
        tables = ", ".join(facts.no_select)
        return Check("captured tables: SELECT", Verdict.WARN,
                     f"the role may not SELECT {tables}: streaming works, snapshots would not",
                     f"GRANT SELECT ON {tables} TO <the relay's role>;")
    return Check("captured tables: SELECT", Verdict.PASS, "the role may SELECT every one")


def _publication_check(facts: CaptureFacts) -> Check:
    if facts.plugin == "wal2json":
        return Check("captured tables: publication", Verdict.PASS,
                     "none needed: wal2json's add-tables names the captured tables")
    pub, coverage = facts.publication, facts.coverage
    names = [shape.qualified for shape in facts.shapes]
    missing = names if coverage is None else [n for n in names if not (
        "*" in coverage[1] or n in coverage[1])]
    publishes = coverage is not None and coverage[0]
    if not missing and publishes:
        return Check("captured tables: publication", Verdict.PASS,
                     f"{pub} publishes inserts, updates and deletes of every captured table")
    what = (f"{pub} does not exist" if coverage is None else
            "; ".join(([f"{pub} does not include {', '.join(missing)}"] if missing else [])
                      + ([] if publishes else [f"{pub} does not publish updates and deletes"])))
    blocked = [n for n in missing if n in facts.not_owned]
    if blocked:
        return Check("captured tables: publication", Verdict.FAIL,
                     f"{what}, and the role does not own {', '.join(blocked)}, so the relay "
                     "cannot add them",
                     f"as the tables' owner: ALTER PUBLICATION {pub} ADD TABLE "
                     f"{', '.join(blocked)}; (or cdc-relay init --capture ... as the owner)")
    return Check("captured tables: publication", Verdict.WARN,
                 f"{what}; run and init --capture make it so on start",
                 f"cdc-relay init --capture '{facts.option}'")
