"""The CLI's plumbing: option types, shared options, secrets from files.

Owns how a value reaches a command - flag > ``CDC_RELAY_*`` environment variable >
``--config`` TOML file > default (click's own precedence: the file becomes the
context's ``default_map``; the file itself is cli/config_file.py) - and the options
several commands share (the database, the outbox, the slot, observability). The sink
and message options are cli/sink_options.py's; how any failure becomes one line on
stderr with a named exit code is cli/frame.py's. It must not contain command logic;
commands live in cli/main.py, cli/ops.py and cli/demo.py and call a composition root
(app/run.py, app/poll.py, ...).
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from cdc_relay import accel
from cdc_relay.cli.config_file import load_config_file as load_config_file  # re-exported
from cdc_relay.cli.frame import (
    run_cli as run_cli,  # re-exported: tests and benchmarks run commands through it
)
from cdc_relay.config import (
    CredentialsConfig,
    OutboxConfig,
    TableRef,
    parse_columns,
    parse_duration,
    validate_identifier,
)
from cdc_relay.errors import ConfigError

F = TypeVar("F", bound=Callable[..., Any])
ENV_PREFIX = "CDC_RELAY_"


class DurationType(click.ParamType):  # type: ignore[type-arg]
    """``500ms``, ``1s``, ``5m``, ``2h``, ``7d`` → seconds (float)."""

    name = "duration"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, int | float):  # a number from the config file: no unit
            value = str(value)
        try:
            return parse_duration(value)
        except ConfigError as exc:
            self.fail(str(exc), param, ctx)


class TableType(click.ParamType):  # type: ignore[type-arg]
    """``table`` or ``schema.table`` → TableRef (validated identifiers)."""

    name = "schema.table"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> TableRef:
        if isinstance(value, TableRef):
            return value
        try:
            return TableRef.parse(str(value))
        except ConfigError as exc:
            self.fail(str(exc), param, ctx)


class IdentifierType(click.ParamType):  # type: ignore[type-arg]
    """A bare SQL identifier (publication name, ...)."""

    name = "identifier"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        try:
            return validate_identifier(str(value), param.name if param and param.name else "name")
        except ConfigError as exc:
            self.fail(str(exc), param, ctx)


DURATION = DurationType()
TABLE = TableType()
IDENTIFIER = IdentifierType()


class FileEnvOption(click.Option):
    """An option whose ``CDC_RELAY_<NAME>`` may also be given as ``CDC_RELAY_<NAME>_FILE``:
    the path of a file holding the value (a mounted secret; one trailing newline dropped)."""

    def resolve_envvar_value(self, ctx: click.Context) -> str | None:
        value = super().resolve_envvar_value(ctx)
        if value is not None or not isinstance(self.envvar, str):
            return value
        variable = self.envvar + "_FILE"
        path = os.environ.get(variable)
        if not path:
            return None
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise click.BadParameter(f"cannot read {variable}={path}: {exc.strerror}",
                                     ctx=ctx, param=self) from exc
        return text[:-1] if text.endswith("\n") else text


def option(*decls: str, **attrs: Any) -> Callable[[F], F]:
    """``click.option`` with ``CDC_RELAY_<NAME>`` (or ``..._FILE``) as its environment variable."""
    long_name = next(d for d in decls if d.startswith("--")).lstrip("-").split("/")[0]
    attrs.setdefault("envvar", ENV_PREFIX + long_name.replace("-", "_").upper())
    attrs.setdefault("show_envvar", True)
    attrs.setdefault("cls", FileEnvOption)
    return click.option(*decls, **attrs)


def credentials_options(f: F) -> F:
    """``--password-command``, ``--aws-rds-iam``, ``--aws-region``: the command runs with the
    password provider they ask for installed (app/credentials.py), so every connection it
    opens takes a fresh password from it."""

    @functools.wraps(f)
    def with_credentials(*args: Any, password_command: str | None, aws_rds_iam: bool,
                         aws_region: str | None, **kwargs: Any) -> Any:
        from cdc_relay.app.credentials import credentials_for

        config = CredentialsConfig(password_command=password_command, aws_rds_iam=aws_rds_iam,
                                   aws_region=aws_region)
        with credentials_for(config, kwargs.get("dsn") or ""):
            return f(*args, **kwargs)

    decorated = option("--aws-region", default=None, metavar="REGION",
                       help="The region --aws-rds-iam signs its tokens for (default: boto3's "
                            "standard chain, e.g. AWS_REGION).")(with_credentials)
    decorated = option("--aws-rds-iam", is_flag=True, default=False,
                       help="Authenticate with an RDS/Aurora IAM token made for each connection "
                            "(boto3; needs sslmode=require or stronger in --dsn).")(decorated)
    decorated = option("--password-command", default=None, metavar="CMD",
                       help="Run CMD (through sh) before every PostgreSQL connection; the first "
                            "line it prints is the password (rotating secrets). Never logged.")(
                                decorated)
    return decorated  # type: ignore[return-value]


def dsn_option(f: F) -> F:
    """``--dsn`` and the options that say where its password comes from (credentials_options)."""
    return credentials_options(
        option("--dsn", required=True, help="PostgreSQL connection string (libpq DSN or URL).")(f))


def table_option(f: F) -> F:
    return option("--table", type=TABLE, default="public.outbox_events", show_default=True,
                  help="The outbox table.")(f)


def columns_option(f: F) -> F:
    return option("--columns", default=None,
                  help="Column names: 'debezium', or FIELD=COLUMN,... "
                       "(fields: id, aggregate_type, aggregate_id, event_type, payload, created_at).")(f)

def slot_option(f: F) -> F:
    return option("--slot", default="cdc_relay", show_default=True,
                  help="Logical replication slot name.")(f)


def plugin_option(f: F) -> F:
    return option("--plugin", type=click.Choice(["wal2json", "pgoutput"]), default=None,
                  help="Logical decoding output plugin [default: an existing slot's plugin, "
                       "else pgoutput].")(f)


def publication_option(f: F) -> F:
    return option("--publication", type=IDENTIFIER, default="cdc_relay_outbox", show_default=True,
                  help="Publication on the outbox table (pgoutput only).")(f)


def format_option(f: F) -> F:
    return option("--format", "output_format", type=click.Choice(["table", "json"]),
                  default="table", show_default=True, help="Output for people or for scripts.")(f)


def outbox_config(table: TableRef, columns: str | None) -> OutboxConfig:
    """The OutboxConfig of ``--table`` and ``--columns``."""
    return OutboxConfig(table=table, columns=parse_columns(columns))


_ALIAS_USED = "cdc_relay.pure_python_decoder"


def pure_python_option(f: F) -> F:
    """``--pure-python`` (and its deprecated spelling ``--pure-python-decoder``)."""
    f = option("--pure-python-decoder", is_flag=True, hidden=True, expose_value=False,
               callback=_alias_used)(f)
    # envvar=None: accel.py reads CDC_RELAY_PURE_PYTHON itself (it also takes a list)
    return option("--pure-python", is_flag=True, default=False, envvar=None,
                  help="Run every path in pure Python even where the compiled ones are built "
                       "(same messages, more CPU per event); also CDC_RELAY_PURE_PYTHON=1.")(f)


def _alias_used(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if value:
        ctx.meta[_ALIAS_USED] = True


def choose_paths(pure_python: bool) -> None:
    """The process's one choice of compiled or pure paths (cdc_relay/accel.py), made before
    anything is built and logged (so after setup_logging); ConfigError for a bad
    CDC_RELAY_PURE_PYTHON."""
    ctx = click.get_current_context(silent=True)
    alias = ctx is not None and bool(ctx.meta.get(_ALIAS_USED))
    if alias:
        logging.getLogger("cdc_relay.cli").warning(
            "--pure-python-decoder is deprecated: use --pure-python (it turns off every "
            "compiled path, not only the decoders)")
    accel.choose(pure_python or alias)
    accel.log_choice()


def standby_dsn_option(f: F) -> F:
    return option("--standby-dsn", default=None,
                  help="A streaming standby of the primary (libpq DSN): doctor, status and "
                       "run's metrics check that it holds a failover-ready copy of the slot "
                       "(PostgreSQL 17+ failover slots; docs/high-availability.md).")(f)


def primary_dsn_option(f: F) -> F:
    return option("--primary-dsn", default=None,
                  help="Decode on a standby (PostgreSQL 16+): --dsn is a hot standby that "
                       "holds the slot, and everything that must write (the slot's record and "
                       "horizon, heartbeats, the publication) goes to this primary "
                       "(docs/high-availability.md, decoding on a standby).")(f)


def observability_options(f: F) -> F:
    f = option("--log-format", type=click.Choice(["text", "json"]), default="text",
               show_default=True, help="Log line format on stderr.")(f)
    f = option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]),
               default="info", show_default=True)(f)
    f = option("--metrics-host", default="127.0.0.1", show_default=True,
               help="Address the metrics/health endpoint binds to.")(f)
    f = option("--metrics-port", type=click.IntRange(0, 65535), default=None,
               help="Serve Prometheus metrics, /healthz and /readyz on this port.")(f)
    return f
