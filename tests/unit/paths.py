"""Building an object on one path, for the tests that compare the two side by side
(docs/design.md, "The compiled paths"). A test that runs on one path at a time takes the
``compiled`` fixture (tests/conftest.py) instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from cdc_relay import accel

T = TypeVar("T")


def built(compiled: bool, make: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``make(*args, **kwargs)`` on the compiled path (which must then be taken: a test of
    it fails, not skips, when the extension is not built) or the pure one."""
    with accel.forced(not compiled):
        made = make(*args, **kwargs)
    if compiled and getattr(made, "compiled", True) is not True:
        raise AssertionError(f"{made!r} is not on the compiled path: is the extension built?")
    return made
