"""``cdc-relay local kafka|sqs``: the click commands only (the serving is cdc_relay.app.local).

Registered on the ``cli`` group by cdc_relay.cli.main. Exit codes: 0 after Ctrl-C or
SIGTERM stopped the service, 1 when it could not start or died.
"""

from __future__ import annotations

import click

from cdc_relay.cli.options import option

_PORT = option("--port", type=click.IntRange(1, 65535), default=None,
               help="Listen on 127.0.0.1:PORT (default: a free port).")


@click.group()
def local() -> None:
    """A throwaway broker on 127.0.0.1 for a first run by hand (memory only; Ctrl-C stops it)."""


@local.command()
@_PORT
def kafka(port: int | None) -> None:
    """A Kafka-protocol broker (Tansu); prints the --brokers address."""
    from cdc_relay.app.local import serve_kafka

    serve_kafka(port, click.echo)


@local.command()
@_PORT
def sqs(port: int | None) -> None:
    """An SQS endpoint (moto's server); prints the --brokers URL and the AWS settings."""
    from cdc_relay.app.local import serve_sqs

    serve_sqs(port, click.echo)
