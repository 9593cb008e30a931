"""The application side's shared core without a database: statements in each driver's
parameter style, the steps an adapter runs, and the one-line ImportError of an
integration whose library is missing (docs/application-side.md)."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from cdc_relay import outbox_core as core
from cdc_relay.config import TableRef
from cdc_relay.errors import ConfigError
from cdc_relay.model import OutboxColumns

ROOT = Path(__file__).resolve().parents[2]
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.mark.parametrize(("style", "marks"), [
    ("format", "%s, %s, %s, %s, %s"), ("numeric", "$1, $2, $3, $4, $5"),
    ("named", ":p1, :p2, :p3, :p4, :p5")])
def test_the_insert_in_each_parameter_style(style: str, marks: str) -> None:
    assert core.insert_sql("Billing.Outbox$Events", OutboxColumns.debezium(), False, style) == (
        'INSERT INTO "Billing"."Outbox$Events" ("id", "aggregatetype", "aggregateid", "type", '
        f'"payload") VALUES ({marks})')


def test_the_mark_and_the_trace_lookup_in_asyncpg_style() -> None:
    assert core.mark_sql(TableRef("app", "processed_events"), "numeric") == (
        'INSERT INTO "app"."processed_events" (event_id) VALUES ($1) '
        "ON CONFLICT (event_id) DO NOTHING RETURNING 1")
    lookup = core.trace_lookup("app.outbox", "named")
    assert "to_regclass(:p1)" in lookup.text and "attname IN (:p2, :p3)" in lookup.text
    assert lookup.params == {"p1": '"app"."outbox"', "p2": "traceparent", "p3": "tracestate"}


class Database:
    """Answers the steps' queries: the trace lookup with ``trace_columns``."""

    def __init__(self, trace_columns: int) -> None:
        self.trace_columns = trace_columns
        self.queries: list[core.Query] = []

    def execute(self, query: core.Query) -> Any:
        self.queries.append(query)
        return (self.trace_columns,) if "pg_attribute" in query.text else None


def _emit(database: Database, **options: Any) -> uuid.UUID:
    where = ("test", uuid.uuid4().hex)  # a database of its own: nothing cached yet
    steps = core.emit_steps("order", "o-1", "created", {"k": 1}, style="numeric",
                            where=lambda: where, **options)
    return core.run_sync(steps, database.execute)


def test_a_trace_context_is_written_where_the_table_has_the_columns() -> None:
    database = Database(trace_columns=2)
    event_id = _emit(database, traceparent=TRACEPARENT, id=uuid.UUID(int=7))
    lookup, insert = database.queries
    assert "pg_attribute" in lookup.text
    assert insert.text.endswith("VALUES ($1, $2, $3, $4, $5, $6, $7)")
    assert insert.params == (event_id, "order", "o-1", "created", '{"k":1}', TRACEPARENT, None)
    assert event_id == uuid.UUID(int=7)


def test_without_the_columns_an_explicit_trace_context_is_refused() -> None:
    with pytest.raises(ConfigError, match="with-trace-context"):
        _emit(Database(trace_columns=0), traceparent=TRACEPARENT)


def test_no_trace_context_means_one_statement_and_no_lookup() -> None:
    database = Database(trace_columns=2)
    _emit(database)
    [insert] = database.queries
    assert insert.text.startswith('INSERT INTO "public"."outbox_events"')


def test_the_id_is_given_once() -> None:
    with pytest.raises(TypeError, match="not both"):
        _emit(Database(0), id=uuid.uuid4(), event_id=uuid.uuid4())


@pytest.mark.parametrize("option", ["id", "event_id"])
def test_the_event_id_may_be_given_as_the_text_of_a_uuid(option: str) -> None:
    given = "1b4e28ba-2fa1-11d2-883f-0016d3cca427"
    database = Database(trace_columns=0)
    event_id = _emit(database, **{option: given})
    [insert] = database.queries
    assert event_id == uuid.UUID(given) and insert.params[0] == uuid.UUID(given)
    assert isinstance(insert.params[0], uuid.UUID)


@pytest.mark.parametrize("given", ["order-17", "", "1b4e28ba-2fa1-11d2-883f-0016d3cca42"])
def test_text_that_is_no_uuid_is_one_clear_error_before_any_query(given: str) -> None:
    database = Database(trace_columns=0)
    with pytest.raises(core.EventIdError, match=f"event id {given!r} is not a UUID"):
        _emit(database, event_id=given)
    assert database.queries == []


def test_an_event_id_of_another_type_is_a_type_error_naming_both_accepted_types() -> None:
    with pytest.raises(TypeError, match=r"uuid\.UUID or its text, got int"):
        _emit(Database(0), event_id=17)


def test_bad_input_fails_when_the_steps_are_made_before_any_query() -> None:
    with pytest.raises(ConfigError):
        core.emit_steps("a", "1", "e", {}, style="format", where=lambda: None, table="a b")
    with pytest.raises(core.EventIdError):
        core.mark_steps("not-a-uuid", table=core.DEFAULT_PROCESSED_TABLE, style="format")


_BLOCKED = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == sys.argv[1]:
            raise ImportError(f"No module named {name!r}")
        return None
sys.meta_path.insert(0, Block())
try:
    __import__("cdc_relay.integrations." + sys.argv[2])
except ImportError as exc:
    print(exc)
"""


@pytest.mark.parametrize(("library", "extra"), [
    ("sqlalchemy", "sqlalchemy"), ("asyncpg", "asyncpg"), ("django", "django")])
def test_an_integration_without_its_library_says_which_extra_to_install(library: str,
                                                                      extra: str) -> None:
    result = subprocess.run([sys.executable, "-c", _BLOCKED, library, extra], cwd=ROOT,
                            capture_output=True, text=True, timeout=60, check=True)
    [line] = result.stdout.splitlines()
    assert line.startswith(f"cdc_relay.integrations.{extra} needs ")
    assert line.endswith(f"pip install 'cdc-relay[{extra}]'")
