"""``python -m cdc_relay`` runs the CLI (through the same entry point as ``cdc-relay``)."""

from cdc_relay.cli.entry import main

main()
