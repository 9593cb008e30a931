"""The grammar of captured tables' names (cdc_relay/capture/qualified.py): unquoted and
PostgreSQL's double-quoted identifiers in ``--capture``, ``cdc-relay snapshot``'s arguments
and a signal's ``data-collections``."""

from __future__ import annotations

import json

import pytest

from cdc_relay.capture.qualified import data_collection, parse_pattern, parse_qualified, split_list
from cdc_relay.capture.selection import Selection, in_option_order
from cdc_relay.capture.signals import Request, SignalRefused, parse_signal
from cdc_relay.errors import ConfigError


@pytest.mark.parametrize(("item", "expected"), [
    ("public.customers", ("public", "customers")),
    ("public.Orders", ("public", "Orders")),  # unquoted: as written, no case folding
    ('public."my-table"', ("public", "my-table")),
    ('"Sales"."Orders"', ("Sales", "Orders")),
    ('"a""b"."c.d"', ('a"b', "c.d")),
    ('"x,y"."t t"', ("x,y", "t t")),
    ('sales."*"', ("sales", "*")),  # a quoted star is a table's name
    ("sales.*", ("sales", None)),
    ('"my schema".*', ("my schema", None)),
])
def test_patterns_take_unquoted_and_quoted_names(item: str, expected: tuple[str, str | None]) -> None:
    assert parse_pattern(item) == expected


@pytest.mark.parametrize(("item", "problem"), [
    ("customers", "name the schema and the table"),
    ("public.my-table", "invalid --capture item table"),
    ('public."my-table', "double quote is not closed"),
    ('public.""', "1 to 63 bytes"),
    ('public."' + "x" * 64 + '"', "1 to 63 bytes"),
    ('"a"b.t', "expected a dot after a quoted name"),
    ("a.b.c", "name the schema and the table"),
    ("public.", "invalid --capture item table"),
])
def test_malformed_names_are_one_line(item: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        parse_pattern(item)


def test_a_list_splits_at_commas_outside_quotes() -> None:
    assert split_list(' public.a , "x,y".t,,public."q""," ') == [
        "public.a", '"x,y".t', 'public."q"","']
    with pytest.raises(ConfigError, match="not closed"):
        split_list('public."a,public.b')


def test_selection_matches_quoted_names_exactly_and_keeps_the_outbox_out() -> None:
    selection = Selection.parse('public."my-table","Sales"."Orders",archive.*',
                                own=[("archive", "outbox_events")])
    assert selection.matches("public", "my-table")
    assert selection.matches("Sales", "Orders")
    assert not selection.matches("sales", "orders")  # case kept inside quotes
    assert selection.matches("archive", "Anything-Else")
    assert not selection.matches("archive", "outbox_events")
    with pytest.raises(ConfigError, match="the outbox table"):
        Selection.parse('"public"."outbox_events"', own=[("public", "outbox_events")])
    assert in_option_order('"Sales"."Orders",public.*', [("public", "b"), ("Sales", "Orders")]) \
        == [("Sales", "Orders"), ("public", "b")]


def _signal(*names: str) -> Request:
    request = parse_signal("s1", "execute-snapshot", json.dumps({"data-collections": list(names)}))
    assert request is not None
    return request


def test_data_collections_take_debeziums_unquoted_names_and_quoted_ones() -> None:
    request = _signal("public.my-table", "Sales.Orders", "plain", '"Sales"."a.b"', 'public."x""y"')
    assert request.tables == (("public", "my-table"), ("Sales", "Orders"),
                                          ("public", "plain"), ("Sales", "a.b"), ("public", 'x"y'))
    with pytest.raises(SignalRefused, match=r"^signal 's1': invalid data-collections name"):
        _signal('public."open')


def test_the_snapshot_command_writes_debeziums_names_unless_they_need_quotes() -> None:
    assert data_collection('"Sales"."Orders"') == "Sales.Orders"
    assert data_collection('public."my-table"') == "public.my-table"
    assert data_collection("customers") == "public.customers"
    assert data_collection('"a.b"."t"') == '"a.b".t'
    assert data_collection('public."x""y"') == 'public."x""y"'
    for name in ('"Sales"."Orders"', 'public."my-table"', '"a.b"."t"', 'public."x""y"'):
        written = _signal(data_collection(name)).tables
        assert written == (parse_qualified(name),)
    with pytest.raises(ConfigError):
        data_collection("public.my-table")
