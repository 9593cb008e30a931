"""The one switch between the compiled fast paths and pure Python (docs/design.md, "The
compiled paths").

Owns: the process's choice, made once - ``--pure-python`` on ``run`` or ``poll``
(``choose(pure=True)``), else the environment variable ``CDC_RELAY_PURE_PYTHON`` (read at
the first question, as psycopg reads ``PSYCOPG_IMPL``): unset, empty or ``0`` uses every
compiled extension that is built, ``1`` none, and a comma-separated list of extension
names (``_croute,_creports``) turns off just those, for measuring what one saves. And the
import of each extension under that choice: ``extension(name)`` is the module, or None
for the pure path - chosen, not built, or built for other fields of OutboxEvent or
Message than cdc_relay/model.py's (then with a warning naming the C slot list to edit).
Every component with a compiled path asks here once, when it is built; the results are
the same on both paths, only the CPU per event differs.

Must not: build anything, be asked per event, or let a component choose for itself
(no ``compiled=`` argument anywhere: one process, one choice).
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import os
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from types import ModuleType

from cdc_relay.errors import ConfigError
from cdc_relay.model import Message, OutboxEvent

ENV_VAR = "CDC_RELAY_PURE_PYTHON"
# Every compiled extension, by the name the switch and the warnings use.
EXTENSIONS = {
    "_cwal2json": "cdc_relay.decoding._cwal2json",
    "_cpgoutput": "cdc_relay.decoding._cpgoutput",
    "_croute": "cdc_relay.decoding._croute",
    "_creports": "cdc_relay.sink.kafka._creports",
    "_cstream": "cdc_relay.wal.stream._cstream",
}
ALL = frozenset(EXTENSIONS)
SLOT_LIST = "cdc_relay/decoding/_cslots.h"
_log = logging.getLogger(__name__)
_pure: frozenset[str] | None = None  # the choice; None until made
_warned: set[str] = set()


def parse(value: str) -> frozenset[str]:
    """The extensions ``CDC_RELAY_PURE_PYTHON=value`` turns off; ConfigError if unknown."""
    value = value.strip()
    if value in ("", "0"):
        return frozenset()
    if value == "1":
        return ALL
    names = frozenset(name.strip() for name in value.split(",") if name.strip())
    unknown = sorted(names - ALL)
    if unknown:
        raise ConfigError(f"{ENV_VAR}={value!r}: unknown extension {', '.join(unknown)}: use 1 "
                          f"(pure Python throughout), 0, or some of {', '.join(sorted(ALL))}")
    return names


def choose(pure: bool = False, environ: Mapping[str, str] = os.environ) -> frozenset[str]:
    """Make the process's choice (the command line, before it builds anything): every
    extension off with ``pure``, else as ``environ`` says. Returns the ones turned off."""
    global _pure
    _pure = ALL if pure else parse(environ.get(ENV_VAR, ""))
    return _pure


def pure_extensions() -> frozenset[str]:
    """The extensions the process does without (its choice, made now if not yet)."""
    return _pure if _pure is not None else choose()


def extension(name: str) -> ModuleType | None:
    """The compiled module ``name`` (a key of EXTENSIONS), or None for the pure path."""
    if name in pure_extensions():
        return None
    try:
        module = importlib.import_module(EXTENSIONS[name])
    except ImportError:
        return None
    problem = fields_problem(module)
    if problem is not None:
        if name not in _warned:
            _warned.add(name)
            _log.warning("%s: running its pure-Python twin instead: %s", name, problem)
        return None
    return module


def fields_problem(module: ModuleType, outbox: type | None = None,
                   message: type | None = None) -> str | None:
    """Why ``module``, which fills or reads OutboxEvent or Message by slot, cannot serve the
    model's classes (their field lists differ from the ones it was built with), or None."""
    for attr, cls in (("OUTBOX_FIELDS", outbox or OutboxEvent),
                      ("MESSAGE_FIELDS", message or Message)):
        built: tuple[str, ...] | None = getattr(module, attr, None)
        if built is None:
            continue
        model = tuple(field.name for field in dataclasses.fields(cls))
        if built != model:
            return (f"{cls.__name__} has the fields {', '.join(model)} but the extension was "
                    f"built for {', '.join(built)}: edit the C slot list ({SLOT_LIST}) with "
                    "cdc_relay/model.py and rebuild")
    return None


def built() -> frozenset[str]:
    """The extensions that import here (whatever the choice)."""
    found = set()
    for name, module in EXTENSIONS.items():
        try:
            importlib.import_module(module)
        except ImportError:
            continue
        found.add(name)
    return frozenset(found)


def all_built() -> bool:
    """True when every compiled extension imports (the compiled tests need them)."""
    return built() == ALL


def describe() -> str:
    """One line for the start-up log: which paths this process runs."""
    pure = pure_extensions()
    missing = ALL - pure - built()
    if pure == ALL:
        return f"pure Python throughout (--pure-python or {ENV_VAR}=1)"
    parts = [f"compiled: {', '.join(sorted(ALL - pure - missing)) or 'none'}"]
    if pure:
        parts.append(f"turned off ({ENV_VAR}): {', '.join(sorted(pure))}")
    if missing:
        parts.append(f"not built: {', '.join(sorted(missing))} (reinstall cdc-relay where a C "
                     "compiler and the Python headers are available)")
    return "; ".join(parts)


def log_choice() -> None:
    """Log which paths run: a warning when an extension is missing (that costs CPU, never
    events), info when some were turned off, and only at debug level for the usual case
    (everything compiled), so a start-up that fails stays one line."""
    missing = ALL - pure_extensions() - built()
    level = (logging.WARNING if missing else logging.INFO if pure_extensions()
             else logging.DEBUG)
    _log.log(level, "compiled paths: %s; the messages are the same on every path", describe())


@contextmanager
def forced(pure: bool | Iterable[str]) -> Iterator[None]:
    """For tests and tools: the choice ``pure`` (True: all off, False: none, or the names
    to turn off) for what is built inside the block, then the previous one again."""
    global _pure
    before = _pure
    _pure = ALL if pure is True else frozenset() if pure is False else frozenset(pure)
    try:
        yield
    finally:
        _pure = before
