"""The frame every command runs in: the click group run, and every failure as one line.

Owns ``run_cli`` (and the console-script entry ``main_entry``): a failure - a usage error,
a bad value (naming the config file's key when it came from there), a RelayError, an
interrupt, anything unexpected - becomes one line on stderr (a JSON line under
``--log-format json``) and a named exit code, never a traceback; and the warnings held
back until logging is set up are printed. Must not define options or contain command
logic (cli/options.py, the commands' modules).
"""

from __future__ import annotations

import logging
import os
import sys

import click

from cdc_relay.cli.config_file import FILE_KEYS, config_first, file_says_json
from cdc_relay.errors import ExitCode, RelayError, mask_secrets
from cdc_relay.logs import DEFERRED_WARNINGS, JsonFormatter, setup_logging


def _json_logging() -> bool:
    return any(isinstance(h.formatter, JsonFormatter) for h in logging.getLogger().handlers)


def _fail(message: str, code: int) -> int:
    message = mask_secrets(message)
    if _json_logging():
        # --log-format json: stderr carries JSON lines only, the final error included.
        logging.getLogger("cdc_relay").error(message, extra={"exit_code": int(code)})
    else:
        click.echo(f"cdc-relay: error: {message}", err=True)
    return code


def _wants_json(args: list[str]) -> bool:
    """--log-format json (flag, environment or config file): then even a usage error is a
    JSON line."""
    config = os.environ.get("CDC_RELAY_CONFIG")
    for i, arg in enumerate(args):
        if arg == "--log-format=json" or (arg == "--log-format" and args[i + 1:i + 2] == ["json"]):
            return True
        if arg == "--config" and i + 1 < len(args):
            config = args[i + 1]
        elif arg.startswith("--config="):
            config = arg.partition("=")[2]
    if "CDC_RELAY_LOG_FORMAT" in os.environ:
        return os.environ["CDC_RELAY_LOG_FORMAT"].strip().lower() == "json"
    return config is not None and file_says_json(config)


def _file_value_error(exc: click.BadParameter) -> str | None:
    """A bad value that came from the config file: the message names the file and the key."""
    from click.core import ParameterSource

    param, ctx = exc.param, exc.ctx
    if param is None or ctx is None or param.name is None:
        return None
    if ctx.get_parameter_source(param.name) is not ParameterSource.DEFAULT_MAP:
        return None
    where = FILE_KEYS.get(param.name)
    if where is None:
        return None
    return f"config file {where[0]}, key {where[1]}: {exc.message}"


def run_cli(group: click.Group, args: list[str] | None = None) -> int:
    """Run the click group; map every failure to one stderr line and a named exit code."""
    args = config_first(sys.argv[1:] if args is None else list(args))
    if _wants_json(args):
        setup_logging("info", "json")
    try:
        code = _run(group, args)
    finally:
        while DEFERRED_WARNINGS:  # the command set up no logging (or failed before it)
            warning = DEFERRED_WARNINGS.pop(0)
            if _json_logging():
                logging.getLogger("cdc_relay.config").warning("%s", warning)
            else:
                click.echo(f"cdc-relay: warning: {warning}", err=True)
    return code


def _run(group: click.Group, args: list[str]) -> int:
    try:
        result = group.main(args=args, prog_name="cdc-relay", standalone_mode=False)
    except click.exceptions.NoArgsIsHelpError as exc:
        click.echo(exc.ctx.get_help() if exc.ctx else str(exc))
        return ExitCode.USAGE
    except click.UsageError as exc:
        from_file = _file_value_error(exc) if isinstance(exc, click.BadParameter) else None
        if from_file is not None:
            return _fail(from_file, ExitCode.USAGE)
        where = f"{exc.ctx.command_path}: " if exc.ctx else ""
        hint = ""
        if isinstance(exc, click.MissingParameter) and exc.param is not None:
            envvar = getattr(exc.param, "envvar", None)
            if isinstance(envvar, str):
                hint = f" (or set {envvar})"
        return _fail(where + exc.format_message().rstrip(".") + hint, ExitCode.USAGE)
    except click.ClickException as exc:
        return _fail(exc.format_message(), exc.exit_code)
    except click.exceptions.Abort as exc:
        if isinstance(exc.__cause__ or exc.__context__, KeyboardInterrupt):
            click.echo("interrupted", err=True)  # click turns Ctrl-C into Abort
            return ExitCode.INTERRUPTED
        click.echo("aborted", err=True)  # e.g. "no" at a confirmation prompt
        return ExitCode.FAILURE
    except RelayError as exc:
        return _fail(str(exc), exc.exit_code)
    except KeyboardInterrupt:
        return ExitCode.INTERRUPTED
    except Exception as exc:  # the last line of defence: never a traceback for a user
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return _fail(f"unexpected {type(exc).__name__}: {message} "
                     "(please report this; --log-level debug shows details)", ExitCode.FAILURE)
    if isinstance(result, int):
        return result
    return ExitCode.OK


def main_entry(group: click.Group) -> None:
    """Console-script entry point."""
    sys.exit(run_cli(group))
