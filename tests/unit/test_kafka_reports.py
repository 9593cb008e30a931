"""A Kafka sink's delivery reports (sink/kafka/sink.py ``Reports``, sink/kafka/_creports.c; docs/design.md,
"The compiled delivery report"): where a success and a failure go, both ways.

Every test runs on the pure twin and on the compiled one. They fail, not skip, when the
extension is not built: CI has a compiler, so a broken build must show.
"""

from __future__ import annotations

import gc
import weakref
from typing import Any

import pytest

from cdc_relay.sink.kafka import _creports
from cdc_relay.sink.kafka.sink import Reports, reports_class
from tests.unit.paths import built

IMPLEMENTATIONS = pytest.mark.parametrize("cls", [Reports, _creports.Reports],
                                          ids=["pure", "compiled"])


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def __call__(self, *args: Any) -> None:
        self.calls.append(args)


def test_the_compiled_reports_are_built_and_chosen_by_default() -> None:
    assert reports_class() is _creports.Reports
    assert built(True, reports_class) is _creports.Reports
    assert built(False, reports_class) is Reports


@IMPLEMENTATIONS
def test_a_success_is_counted_and_handed_to_the_handler(cls: type[Reports]) -> None:
    handler, failure = Recorder(), Recorder()
    reports = cls(handler, failure)
    callback = reports.callback(7)
    assert callback(None, "the message") is None
    assert handler.calls == [(7, None)] and failure.calls == []
    assert reports.delivered == 1


@IMPLEMENTATIONS
def test_a_failure_goes_to_failure_with_the_error_and_message_uncounted(cls: type[Reports]) -> None:
    handler, failure = Recorder(), Recorder()
    reports = cls(handler, failure)
    error = object()
    reports.callback(3)(error, "the message")
    assert failure.calls == [(3, error, "the message")] and handler.calls == []
    assert reports.delivered == 0
    reports.delivered += 1  # the sink counts a failure it hands over
    assert reports.delivered == 1


@IMPLEMENTATIONS
def test_a_report_goes_to_the_handler_current_when_it_is_served(cls: type[Reports]) -> None:
    first, second = Recorder(), Recorder()
    reports = cls(first, Recorder())
    early = reports.callback(1)  # produced while the first handler was current
    reports.handler = second
    early(None, None)
    assert (first.calls, second.calls) == ([], [(1, None)])
    assert reports.handler is second


@IMPLEMENTATIONS
def test_what_the_handler_raises_reaches_the_caller(cls: type[Reports]) -> None:
    def handler(token: int, error: object) -> None:
        raise RuntimeError(f"handler failed on {token}")

    reports = cls(handler, Recorder())
    with pytest.raises(RuntimeError, match="handler failed on 9"):
        reports.callback(9)(None, None)


@IMPLEMENTATIONS
def test_a_callback_takes_exactly_error_and_message(cls: type[Reports]) -> None:
    callback = cls(Recorder(), Recorder()).callback(1)
    with pytest.raises(TypeError):
        callback(None)  # type: ignore[call-arg]


@IMPLEMENTATIONS
def test_reports_in_a_cycle_with_their_handler_are_collected(cls: type[Reports]) -> None:
    class Session:  # holds its sink, whose reports hold the session's handler
        def __init__(self) -> None:
            self.reports = cls(self.on_delivery, Recorder())
            self.reports.callback(1)(None, None)  # a callback lives until its report
            self.reports.batch = self.on_delivered
            self.reports.callback(2)(None, None)  # kept until handed over

        def on_delivery(self, token: int, error: object) -> None:
            pass

        def on_delivered(self, tokens: list[int]) -> None:
            pass

    session = Session()
    gone = weakref.ref(session)
    del session
    gc.collect()
    assert gone() is None


@IMPLEMENTATIONS
def test_with_a_batch_handler_successes_are_kept_until_handed_over(cls: type[Reports]) -> None:
    handler, batch = Recorder(), Recorder()
    reports = cls(handler, Recorder())
    assert reports.batch is None
    reports.batch = batch
    for token in (4, 2, 9):
        reports.callback(token)(None, "the message")
    assert batch.calls == [] and handler.calls == []
    assert reports.delivered == 3  # counted when served: poll's delta
    reports.hand_over()
    assert batch.calls == [([4, 2, 9],)]
    reports.hand_over()  # nothing kept: no call
    reports.callback(5)(None, None)
    reports.hand_over()
    assert batch.calls == [([4, 2, 9],), ([5],)] and handler.calls == []


@IMPLEMENTATIONS
def test_a_failure_hands_over_the_successes_served_before_it_first(cls: type[Reports]) -> None:
    order: list[tuple[str, object]] = []
    reports = cls(Recorder(), lambda token, error, message: order.append(("failure", token)))
    reports.batch = lambda tokens: order.append(("batch", list(tokens)))
    reports.callback(1)(None, None)
    reports.callback(2)(None, None)
    reports.callback(3)(object(), None)
    reports.callback(4)(None, None)
    reports.hand_over()
    assert order == [("batch", [1, 2]), ("failure", 3), ("batch", [4])]


@IMPLEMENTATIONS
def test_the_batch_handler_changes_only_with_nothing_kept(cls: type[Reports]) -> None:
    first, second, handler = Recorder(), Recorder(), Recorder()
    reports = cls(handler, Recorder())
    reports.batch = first
    reports.callback(1)(None, None)
    with pytest.raises(RuntimeError, match="hand_over"):
        reports.batch = second
    reports.hand_over()
    reports.batch = None  # back to one call per success
    reports.callback(2)(None, None)
    assert (first.calls, handler.calls) == ([([1],)], [(2, None)])


@IMPLEMENTATIONS
def test_what_the_batch_handler_raises_reaches_the_caller_and_the_tokens_are_not_kept(
        cls: type[Reports]) -> None:
    def batch(tokens: list[int]) -> None:
        raise RuntimeError(f"batch failed on {tokens}")

    reports = cls(Recorder(), Recorder())
    reports.batch = batch
    reports.callback(6)(None, None)
    with pytest.raises(RuntimeError, match=r"batch failed on \[6\]"):
        reports.hand_over()
    reports.batch = None  # nothing kept: the handler may change


def test_compiled_reports_refuse_a_handler_that_cannot_be_called() -> None:
    with pytest.raises(TypeError):
        _creports.Reports(None, Recorder())  # type: ignore[arg-type]
    reports = _creports.Reports(Recorder(), Recorder())
    with pytest.raises(TypeError):
        reports.handler = None  # type: ignore[assignment]
    with pytest.raises(TypeError):
        reports.batch = 3  # type: ignore[assignment]
