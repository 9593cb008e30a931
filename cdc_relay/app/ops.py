"""Composition root of the operator commands: ``status``, ``doctor``, ``slot drop``.

Wires ops/status.py and ops/doctor/ to what cli/ops.py parsed and hands back the text to
print. Must not parse options or print (cli/ops.py does), or gather facts itself (ops/
does). Imports no driver at module level: each command loads what it uses.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cdc_relay.config import KafkaConfig, OutboxConfig
from cdc_relay.errors import ExitCode

if TYPE_CHECKING:
    from cdc_relay.sink.factory import OtherSink


def status(dsn: str, slot: str, outbox: OutboxConfig, standby_dsn: str | None,
           output_format: str, signal_table: str | None = None) -> str:
    """``status``: the report, as text or JSON."""
    from cdc_relay.ops.status import status as read_status

    report = read_status(dsn, slot, outbox, standby_dsn=standby_dsn, signal_table=signal_table)
    return report.to_json() if output_format == "json" else "\n".join(report.lines())


def doctor(*, dsn: str, outbox: OutboxConfig, slot: str, plugin: str | None, publication: str,
           mode: str, kafka: KafkaConfig | None, sink: OtherSink | None, standby_dsn: str | None,
           exactly_once: bool, checkpoint_topic: str, output_format: str,
           capture: str | None = None) -> tuple[str, ExitCode]:
    """``doctor``: the checks as text or JSON, and the exit code they give (0, 1, 3 or 6)."""
    from cdc_relay.ops.doctor.facts import DoctorSettings
    from cdc_relay.ops.doctor.gather import run_doctor
    from cdc_relay.ops.doctor.report import exit_code, format_checks, format_checks_json

    checks = run_doctor(DoctorSettings(dsn=dsn, outbox=outbox, slot=slot,
                                      plugin=plugin or "pgoutput",
                                      plugin_from_slot=plugin is None,
                                      publication=publication, mode=mode,
                                      kafka=kafka, sink=sink, standby_dsn=standby_dsn))
    if exactly_once:
        from cdc_relay.ops.doctor.gather_exactly_once import run_exactly_once_checks

        checks += run_exactly_once_checks(dsn, slot, kafka, checkpoint_topic)
    if capture is not None:
        from cdc_relay.ops.doctor.gather_capture import run_capture_checks

        table = outbox.table  # a TableRef: no --capture pattern takes the outbox
        checks += run_capture_checks(dsn, capture, publication, plugin or "pgoutput",
                                     own=((table.schema, table.name),))
    text = format_checks_json(checks) if output_format == "json" else format_checks(checks)
    return text, exit_code(checks)


def drop_slot_question(dsn: str, slot: str) -> str:
    """What ``slot drop`` asks before dropping (the DSN without its password)."""
    from cdc_relay.pg.db import describe_dsn

    return (f"Drop replication slot {slot!r} on {describe_dsn(dsn)}? Events committed "
            "while no slot exists are never relayed")


def drop_slot(dsn: str, slot: str) -> None:
    """``slot drop``: drop it (refused while a relay streams from it)."""
    from cdc_relay.ops.status import drop_replication_slot

    drop_replication_slot(dsn, slot)
