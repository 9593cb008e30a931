"""``cdc-relay config show COMMAND [OPTIONS]``: the effective configuration of a command.

Owns resolving a command's options the way the command itself would (flag > environment
variable or its ``_FILE`` form > ``--config`` file > default) without running it, and
printing each value with where it came from, secrets masked. Must not run the command
nor connect to anything.
"""

from __future__ import annotations

import os
from typing import Any

import click
from click.core import ParameterSource

from cdc_relay.cli.config_file import FILE_KEYS
from cdc_relay.cli.options import DurationType
from cdc_relay.errors import mask_secrets

_SECRET_WORDS = ("password", "secret", "token", "key")


def _command(root: click.Context, words: list[str]) -> tuple[list[str], click.Command, list[str]]:
    """(the command's path, the command, the arguments after it)."""
    command: click.Command = root.command
    path: list[str] = []
    while isinstance(command, click.Group):
        if not words or words[0].startswith("-"):
            raise click.UsageError("name a command, e.g. cdc-relay config show run (its options may follow)")
        name = words.pop(0)
        sub = command.get_command(root, name)
        if sub is None:
            raise click.UsageError(f"no command {' '.join([*path, name])!r}")
        path.append(name)
        command = sub
    return path, command, words


_UNITS = (("w", 604800.0), ("d", 86400.0), ("h", 3600.0), ("m", 60.0), ("s", 1.0))


def duration_text(seconds: float) -> str:
    """Seconds as the largest whole unit a user would write: 604800 -> 1w, 0.5 -> 500ms."""
    for unit, size in _UNITS:
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return "0" if seconds == 0 else f"{seconds * 1000:g}ms"


def _masked(name: str, value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, tuple | list):
        return ", ".join(_masked(name, v) for v in value) or "-"
    text = mask_secrets(str(value))
    if isinstance(value, str) and "=" in text:  # KEY=VALUE settings: mask secret keys
        key, _, rest = text.partition("=")
        if any(word in key.lower() for word in _SECRET_WORDS) and rest != "***":
            return f"{key}=***"
    return text


def _source(ctx: click.Context, param: click.Option) -> str:
    assert param.name is not None
    source = ctx.get_parameter_source(param.name)
    if source is ParameterSource.COMMANDLINE:
        return "flag"
    if source is ParameterSource.ENVIRONMENT:
        named = param.envvar if isinstance(param.envvar, str) else "?"
        return f"env {named}" if named in os.environ else f"env {named}_FILE"
    if source is ParameterSource.DEFAULT_MAP:
        where = FILE_KEYS.get(param.name)
        return f"file {where[0]} ({where[1]})" if where else "file"
    return "default"


def effective_configuration(root: click.Context, words: list[str]) -> list[tuple[str, str, str]]:
    """(option, value, source) for each option of the command ``words`` names."""
    path, command, args = _command(root, list(words))
    default_map: Any = root.default_map or {}
    for name in path:
        default_map = default_map.get(name, {}) if isinstance(default_map, dict) else {}
    ctx = command.make_context(" ".join(path), args, default_map=default_map or None,
                               resilient_parsing=True)
    rows = []
    for param in command.params:
        if not isinstance(param, click.Option) or param.hidden or not param.name:
            continue
        if param.name == "help":
            continue
        option = next((o for o in param.opts if o.startswith("--")), param.opts[0])
        value = ctx.params.get(param.name)
        if isinstance(param.type, DurationType) and isinstance(value, float):
            value = duration_text(value)
        rows.append((option, _masked(param.name, value), _source(ctx, param)))
    return rows


@click.group("config")
def config() -> None:
    """Inspect the configuration the relay would run with."""


@config.command("show", context_settings={"ignore_unknown_options": True,
                                          "allow_extra_args": True})
@click.argument("words", nargs=-1, type=click.UNPROCESSED, metavar="COMMAND [OPTIONS]")
@click.pass_context
def show(ctx: click.Context, words: tuple[str, ...]) -> None:
    """Print each option of COMMAND with its value and source (flag, env, file, default);
    secrets masked. E.g. cdc-relay --config relay.toml config show run."""
    rows = effective_configuration(ctx.find_root(), list(words))
    width = max(len(r[0]) for r in rows)
    value_width = min(60, max(len(r[1]) for r in rows))
    for option, value, source in rows:
        click.echo(f"{option:<{width}}  {value:<{value_width}}  {source}")
