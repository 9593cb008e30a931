"""``python -m cdc_relay`` runs the CLI."""

from cdc_relay.cli.main import main

main()
