"""The one text shortener: error reasons and table cells as one bounded line."""

from __future__ import annotations

import pytest

from cdc_relay.text import ELLIPSIS, one_line, shorten


def test_whitespace_runs_become_one_space() -> None:
    assert one_line("broker\n  said \t no\n") == "broker said no"
    assert shorten("broker\n  said   no", 100) == "broker said no"


def test_text_within_the_limit_is_kept_whole() -> None:
    assert shorten("x" * 10, 10) == "x" * 10


def test_cut_text_is_exactly_the_limit_and_ends_with_an_ellipsis() -> None:
    cut = shorten("x" * 10_000, 2000)
    assert len(cut) == 2000
    assert cut == "x" * 1999 + ELLIPSIS


def test_the_limit_applies_after_joining_lines() -> None:
    assert shorten("a\n\n\n\nb", 3) == "a b"


def test_a_limit_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        shorten("text", 0)
