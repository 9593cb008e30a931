"""The compiled extensions survive misuse through their Python API (docs/design.md, "The
compiled paths").

Objects made with ``__new__`` and never initialised, objects whose ``tp_clear`` the
garbage collector ran, a released memoryview, and a garbage collection that changes what
a compiled function was reading: each must raise or decline, never crash. Every case runs
in a child interpreter, so a segfault fails its test instead of ending pytest; under
``make sanitize`` the child is the ASan build, which also catches reads of freed memory
that a plain build survives by luck.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cdc_relay import accel

pytestmark = pytest.mark.skipif(not accel.all_built(), reason="compiled extensions not built")

_CLEAR = """
import ctypes
def tp_clear(obj):
    '''Run obj's type's tp_clear, as the garbage collector does to a cycle.'''
    get_slot = ctypes.pythonapi.PyType_GetSlot
    get_slot.restype = ctypes.c_void_p
    get_slot.argtypes = [ctypes.py_object, ctypes.c_int]
    clear = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object)(get_slot(type(obj), 51))
    clear(obj)
"""


def run_child(*parts: str) -> str:
    """Run the code ``parts`` (each dedented) in a child interpreter; its stdout. Fails on a
    crash or an exception."""
    code = "\n".join(textwrap.dedent(part) for part in parts)
    # run from here, not the checkout: the child imports cdc_relay as pytest does (the
    # sanitizer build puts its copy on PYTHONPATH)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=False, cwd=Path(__file__).parent)
    assert done.returncode == 0, (
        f"child exited with {done.returncode} (negative: killed by that signal)\n"
        f"{done.stdout}{done.stderr}")
    return done.stdout


def refused(call: str, exception: str = "TypeError") -> str:
    """Code that prints the message of ``exception`` raised by ``call``, else fails."""
    return f"""
try:
    {call}
except {exception} as exc:
    print(exc)
else:
    raise SystemExit("no {exception}")
"""


def test_the_reader_reads_a_released_memoryview_only_through_the_python_path() -> None:
    out = run_child("""
        from cdc_relay.wal.stream._cstream import Changes
        decoded, other = [], []
        data = bytearray(b"w" + bytes(24) + b"payload")
        view = memoryview(data)
        view.release()  # the pure path's bytes(view) raises ValueError now
        changes = Changes(lambda one: (32, view), lambda p, n: decoded.append(p),
                          lambda n, d: other.append(n), print, object())
        changes()
        print(decoded, other)
    """)
    assert out.strip() == "[] [32]"


def test_set_plan_on_an_uninitialised_wal2json_reader_is_refused() -> None:
    out = run_child("""
        from cdc_relay.decoding._cwal2json import Reader
        reader = Reader.__new__(Reader)
    """, refused("reader.set_plan((0, 1, 2, 3, 4, 5), (), 6)"))
    assert "not initialised" in out


def test_an_uninitialised_route_is_refused() -> None:
    out = run_child("""
        from cdc_relay.decoding._croute import Route
        route = Route.__new__(Route)
    """, refused("route.route(object())"))
    assert "not initialised" in out


def test_the_handler_of_uninitialised_reports_is_missing() -> None:
    out = run_child("""
        from cdc_relay.sink.kafka._creports import Reports
        reports = Reports.__new__(Reports)
    """, refused("reports.handler", "AttributeError"))
    assert "not initialised" in out


def test_uninitialised_reports_hand_out_no_callback() -> None:
    out = run_child("""
        from cdc_relay.sink.kafka._creports import Reports
        reports = Reports.__new__(Reports)
    """, refused("reports.callback(1)(None, None)"))
    assert "not initialised" in out


def test_a_report_whose_reports_were_cleared_is_refused() -> None:
    out = run_child(_CLEAR + """
from cdc_relay.sink.kafka._creports import Reports
reports = Reports(print, print)
callback = reports.callback(1)
tp_clear(reports)
""", refused("callback(None, None)"))
    assert "not initialised" in out


@pytest.mark.parametrize("make", [
    "Changes(print, print, print, print, object())",
    "Decode(print, print, Lsn)",
    "Route({}, print, OutboxEvent, Message).route",
    "Sender(print, Reports(print, print), Message, print, print).send",
])
def test_a_cleared_callable_refuses_to_be_called(make: str) -> None:
    out = run_child(_CLEAR + f"""
from cdc_relay.decoding._croute import Route
from cdc_relay.decoding._cwal2json import Decode
from cdc_relay.model import Lsn, Message, OutboxEvent
from cdc_relay.sink.kafka._creports import Reports, Sender
from cdc_relay.wal.stream._cstream import Changes
target = {make}
obj = getattr(target, "__self__", target)
tp_clear(obj)
args = (object(), 1) if "{make}".startswith(("Decode", "Sender")) else (
    () if "{make}".startswith("Changes") else (object(),))
""", refused("target(*args)"))
    assert "not initialised" in out


_COLLECTING = """
import gc
from cdc_relay.model import Message, OutboxEvent
class Meddler:
    '''Garbage whose finalizer changes what the compiled code is reading.'''
    def __init__(self, action):
        self.action, self.me = action, self
    def __del__(self):
        self.action()
def meddle(action):
    Meddler(action)
    gc.set_threshold(1)  # every allocation of a tracked object collects
"""


def test_the_router_holds_what_it_reads_while_a_collection_clears_its_cache() -> None:
    out = run_child(_COLLECTING + """
from cdc_relay.config import RouterConfig
from cdc_relay.routing import Router
router = Router(RouterConfig(topic_pattern="t.{aggregate_type}"))
def event():
    return OutboxEvent("i" * 40, "agg" * 20, "k" * 40, "type" * 10, b"p" * 100, 7, 1)
expected = router.route(event())  # caches the pair
ev = event()
def clear():
    router._cache.clear()
    object.__setattr__(ev, "payload", b"other")
    object.__setattr__(ev, "id", "j" * 40)
meddle(clear)
got = router.route(ev)
gc.set_threshold(700)
print(got.topic, got.headers[1:] == expected.headers[1:], got.key == expected.key)
""")
    assert out.split() == ["t." + "agg" * 20, "True", "True"]


def test_the_sender_holds_the_message_while_a_collection_changes_it() -> None:
    out = run_child(_COLLECTING + """
from cdc_relay.sink.kafka._creports import Reports, Sender
sent = []
def produce(*args):
    sent.append(args[:3] + args[6:])
message = Message("t" * 50, b"k" * 50, b"v" * 50, [("id", b"1")], 5, None)
def change():
    object.__setattr__(message, "topic", "other")
    object.__setattr__(message, "value", b"w")
    object.__setattr__(message, "headers", [])
sender = Sender(produce, Reports(print, print), Message, print, print)
meddle(change)
sender.send(message, 1)
gc.set_threshold(700)
print(sent[0][0] in ("t" * 50, "other"), sent[0][1] in (b"v" * 50, b"w"))
""")
    assert out.split() == ["True", "True"]
