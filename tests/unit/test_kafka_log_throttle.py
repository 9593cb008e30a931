"""librdkafka's repeated lines are throttled: one per kind of message per window."""

from __future__ import annotations

import logging

import pytest

from cdc_relay.sink.kafka.client import _MaskingLogger


def test_repeated_librdkafka_lines_are_collapsed_and_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    throttled = _MaskingLogger(logging.getLogger("cdc_relay.kafka.test"))
    with caplog.at_level(logging.INFO, logger="cdc_relay.kafka.test"):
        for attempt in range(300):
            throttled.log(logging.WARNING, "FAIL 127.0.0.1:9: Connect failed after %dms", attempt)
        throttled.log(logging.WARNING, "sasl.password=hunter2 rejected")
        # the window has passed for the first kind of line
        throttled._seen = {k: (first - 31, n) for k, (first, n) in throttled._seen.items()}
        throttled.log(logging.WARNING, "FAIL 127.0.0.1:9: Connect failed after %dms", 301)
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == "FAIL 127.0.0.1:9: Connect failed after 0ms"
    assert lines[1] == "sasl.password=*** rejected"
    assert lines[2].endswith("(and 299 similar line(s) in the last 30 s)")
    assert len(lines) == 3
