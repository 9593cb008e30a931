"""The process entry point of ``cdc-relay`` and ``python -m cdc_relay``.

Owns one decision: the collector's thresholds are set (cdc_relay/runtime.py) before
anything heavy is imported. Importing click, confluent-kafka and psycopg allocates
~50,000 long-lived objects; under CPython's default thresholds that is ~80 young
collections, ~10 ms of every command's start-up CPU (docs/design.md, start-up). Every
command gets the tuned collector, not only ``run`` and ``poll``: a short command only
collects less often while it runs.

Must not import the CLI, or anything else heavy, at module level: importing this module
changes nothing (tests/unit/test_runtime.py checks both).
"""

from __future__ import annotations


def main() -> None:
    """Console-script entry point: tune the collector, then run the CLI."""
    from cdc_relay.runtime import tune_gc

    tune_gc()
    from cdc_relay.cli.main import main as cli_main

    cli_main()
