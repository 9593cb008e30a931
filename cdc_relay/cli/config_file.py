"""The ``--config`` TOML file: reading it into click's ``default_map``, its keys, and
where a value came from.

Owns the file's shape (top-level keys for every command that has the option, a
``[command]`` section per command, keys = the options' long names, old spellings warned),
``FILE_KEYS`` (which file and key set a parameter, for error messages and ``config
show``), moving ``--config`` given after the subcommand to the front, and peeking at the
file's ``log_format`` before click runs. Must not contain command logic nor print.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from cdc_relay.errors import ConfigError
from cdc_relay.logs import DEFERRED_WARNINGS


def _leaf_commands(group: click.Group, path: tuple[str, ...] = ()) -> Iterator[
        tuple[tuple[str, ...], click.Command]]:
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            yield from _leaf_commands(command, (*path, name))
        else:
            yield (*path, name), command


def _param_names(command: click.Command) -> set[str]:
    return {p.name for p in command.params if isinstance(p, click.Option) and p.name}


def _file_keys(command: click.Command) -> dict[str, str]:
    """A command's config-file keys: each option's long name (``format``, ``log_level``)
    -> its parameter name (``output_format``). Hidden options take no key."""
    keys: dict[str, str] = {}
    for param in command.params:
        if isinstance(param, click.Option) and param.name and not param.hidden:
            longs = [o for o in param.opts if o.startswith("--")]
            if longs:
                keys[_normalise(longs[0].lstrip("-"))] = param.name
    return keys


# param name -> (file, key as written): a bad value from the file names both.
FILE_KEYS: dict[str, tuple[str, str]] = {}


def _param_for_key(key: str, keys: dict[str, str], path: str) -> str | None:
    """The parameter a file key sets; an old spelling (the parameter's own name, e.g.
    ``output_format``) is accepted with a warning."""
    name = _normalise(key)
    if name in keys:
        return keys[name]
    if name in keys.values():
        option = next(k for k, v in keys.items() if v == name).replace("_", "-")
        DEFERRED_WARNINGS.append(f"config file {path}: key {key!r} is an old spelling; use "
                               f"{option.replace('-', '_')!r} (the option --{option})")
        return name
    return None


def _normalise(key: str) -> str:
    return key.replace("-", "_")


def _to_option_value(value: Any) -> Any:
    # [producer_config] / [sink_config] as a TOML table → ("key=value", ...) like the repeated flag.
    if isinstance(value, dict):
        return tuple(f"{k}={v}" for k, v in value.items())
    return value


def load_config_file(path: str, group: click.Group) -> dict[str, Any]:
    """Read a TOML file into a click ``default_map`` for every (sub)command.

    Top-level keys apply to each command that has that option; ``[run]``, ``[poll]``,
    ``[dead-letters.list]``… sections to one command. Unknown keys are errors.
    """
    data = _read_toml(path)
    leaves = dict(_leaf_commands(group))
    by_name = {" ".join(p): c for p, c in leaves.items()} | {".".join(p): c for p, c in leaves.items()}
    all_keys: dict[str, str] = {}
    for command in leaves.values():
        all_keys.update(_file_keys(command))
    shared: dict[str, Any] = {}
    sections: dict[tuple[str, ...], dict[str, Any]] = {}
    captured: dict[tuple[str, ...], dict[str, Any]] = {}  # [capture]: below a command's own

    def section(prefix: tuple[str, ...], table: dict[str, Any]) -> None:
        for key, value in table.items():
            name = _normalise(key)
            path_ = (*prefix, key)
            if not prefix and name == "capture" and isinstance(value, dict):
                _capture_section(value, leaves, captured, path)
                continue
            if isinstance(value, dict) and name not in ("producer_config", "sink_config"):
                section(path_, value)
                continue
            command_path = tuple(prefix)
            if not command_path:
                param = _param_for_key(key, all_keys, path)
                if param is None:
                    raise ConfigError(f"unknown key {key!r} in config file {path}")
                shared[param] = _to_option_value(value)
                FILE_KEYS[param] = (path, key)
                continue
            command = by_name.get(".".join(command_path))
            if command is None:
                raise ConfigError(f"unknown section [{'.'.join(command_path)}] in config file {path}")
            param = _param_for_key(key, _file_keys(command), path)
            if param is None:
                raise ConfigError(
                    f"unknown key {key!r} in section [{'.'.join(command_path)}] of {path}"
                )
            sections.setdefault(command_path, {})[param] = _to_option_value(value)
            FILE_KEYS[param] = (path, f"[{'.'.join(command_path)}] {key}")

    section((), data)
    for command_path, values in captured.items():
        sections[command_path] = values | sections.get(command_path, {})
    return _default_map(leaves, shared, sections)


def _is_capture(param: str) -> bool:
    """Whether ``param`` is one of table CDC's options (cli/capture.py)."""
    return (param == "capture" or param.startswith("capture_")
            or param in ("no_outbox", "signal_table", "snapshot_chunk_size"))


def _capture_section(table: dict[str, Any], leaves: dict[tuple[str, ...], click.Command],
                     captured: dict[tuple[str, ...], dict[str, Any]], path: str) -> None:
    """``[capture]``: table CDC's options for every command that has them (``run``,
    ``init``, ``doctor``), named without their ``capture`` prefix: ``tables`` is
    ``--capture``, ``prefix`` ``--capture-prefix``, ``no_outbox`` ``--no-outbox``..."""
    for key, value in table.items():
        name = _normalise(key)
        wanted = ("capture",) if name == "tables" else (f"capture_{name}", name)
        found = False
        for command_path, command in leaves.items():
            keys = _file_keys(command)
            param = next((keys[k] for k in wanted if k in keys and _is_capture(keys[k])), None)
            if param is not None:
                captured.setdefault(command_path, {})[param] = _to_option_value(value)
                FILE_KEYS[param] = (path, f"[capture] {key}")
                found = True
        if not found:
            raise ConfigError(f"unknown key {key!r} in section [capture] of {path} (its keys: "
                              "tables, prefix, tombstones, no_outbox, truncate, ... as the "
                              "--capture-* options without their prefix)")


def _read_toml(path: str) -> dict[str, Any]:
    import tomllib  # only with --config: start-up without it does not pay for the parser

    try:
        return tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc


def _default_map(leaves: dict[tuple[str, ...], click.Command], shared: dict[str, Any],
                 sections: dict[tuple[str, ...], dict[str, Any]]) -> dict[str, Any]:
    """Click's nested ``default_map``: shared keys a command has, then its own section's."""
    default_map: dict[str, Any] = {}
    for command_path, command in leaves.items():
        values = {k: v for k, v in shared.items() if k in _param_names(command)}
        values.update(sections.get(command_path, {}))
        node = default_map
        for part in command_path[:-1]:
            node = node.setdefault(part, {})
        node[command_path[-1]] = values
    return default_map


def config_first(args: list[str]) -> list[str]:
    """``--config FILE`` may come after the subcommand too: move it to the front (the group
    reads the file before the subcommand parses its options)."""
    front: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            rest += args[i:]
            break
        if arg == "--config" and i + 1 < len(args):
            front += args[i:i + 2]
            i += 2
            continue
        if arg.startswith("--config="):
            front.append(arg)
        else:
            rest.append(arg)
        i += 1
    return front + rest


def file_says_json(path: str) -> bool:
    """``log_format = "json"`` at the top of the file or in any section (errors: no)."""
    try:
        data = _read_toml(path)
    except ConfigError:
        return False  # reported as usual, once the group reads the file
    tables = [data, *(v for v in data.values() if isinstance(v, dict))]
    return any(str(t.get("log_format", t.get("log-format", ""))).lower() == "json"
               for t in tables)
