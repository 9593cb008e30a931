"""The HTTP sink without a server: URLs, headers, batches, the signature scheme, Retry-After, settings."""

from __future__ import annotations

import hashlib
import hmac

import orjson
import pytest

from cdc_relay.errors import ConfigError
from cdc_relay.model import Message
from cdc_relay.sink.base import Cause, Delivery, ErrorKind, collect
from cdc_relay.sink.http import requests
from cdc_relay.sink.http.config import parse_http
from cdc_relay.sink.http.sink import HttpSink


def message(n: int = 1, key: str = "order/1") -> Message:
    return Message("outbox.event.order", key.encode(), b'{"n":%d}' % n,
                   [("id", f"e-{n}".encode()), ("event_type", b"OrderChanged"),
                    ("aggregate_type", b"order"), ("note", "grüße".encode())], 1_700_000_000_000)


def test_the_url_template_is_filled_percent_encoded() -> None:
    url = requests.url_of("https://h/hooks/{aggregate_type}/{aggregate_id}?t={topic}", message())
    assert url == "https://h/hooks/order/order%2F1?t=outbox.event.order"


def test_one_event_is_its_value_with_its_headers_and_an_idempotency_key() -> None:
    body, headers = requests.single(message())
    assert body == b'{"n":1}'
    assert headers["Idempotency-Key"] == headers["id"] == "e-1"
    assert headers["aggregate_id"] == "order/1" and headers["timestamp"] == "1700000000000"
    assert headers["note"] == "gr%C3%BC%C3%9Fe"  # not printable ASCII: percent-encoded
    assert headers["Content-Type"] == "application/json"


def test_a_batch_is_a_json_array_of_envelopes_keyed_by_the_hash_of_its_ids() -> None:
    body, headers = requests.batch([message(1), message(2, key="b")])
    envelopes = orjson.loads(body)
    assert [e["payload"] for e in envelopes] == [{"n": 1}, {"n": 2}]
    assert envelopes[1]["headers"]["id"] == "e-2" and envelopes[1]["key"] == "b"
    assert headers["Idempotency-Key"] == "sha256:" + hashlib.sha256(b"e-1,e-2").hexdigest()


def test_the_signature_is_hmac_sha256_of_timestamp_dot_body_as_documented() -> None:
    headers = requests.signed({}, b"k", 1700000000, b"{}")
    expected = hmac.new(b"k", b"1700000000.{}", hashlib.sha256).hexdigest()
    assert headers == {"X-Cdc-Relay-Timestamp": "1700000000",
                       "X-Cdc-Relay-Signature": "v1=" + expected}
    assert requests.signed({"a": "b"}, None, 1, b"") == {"a": "b"}


@pytest.mark.parametrize(("value", "seconds"), [
    ("7", 7.0), ("600", 60.0), (None, None), ("soon", None),
    ("Wed, 21 Oct 2015 07:28:05 GMT", 5.0)])
def test_retry_after_reads_seconds_or_a_date_capped(value: str | None, seconds: float | None) -> None:
    now = 1445412480.0  # 07:28:00 that day
    assert requests.retry_after(value, now, 60.0) == seconds


@pytest.mark.parametrize(("brokers", "items", "words"), [
    ("ftp://h/x", [], "URL template"),
    ("http://{aggregate_type}.h/x", [], "not in the host"),
    ("http://h/{nope}", [], "unknown placeholder"),
    ("http://h/x", ["method=GET"], "POST or PUT"),
    ("http://h/x", ["signing_secret_env=CDC_RELAY_TEST_UNSET_VARIABLE"], "not set"),
    ("http://h/x", ["signing_secret_file=/no/such"], "no such file"),
])
def test_bad_settings_are_config_errors_naming_the_fix(brokers: str, items: list[str],
                                                       words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        parse_http(brokers, items)


def test_header_names_must_be_http_tokens_and_not_the_sinks_own() -> None:
    with pytest.raises(ConfigError, match="not a legal HTTP header name"):
        parse_http("http://h/x", [], header_names=["a b"])
    with pytest.raises(ConfigError, match="own headers"):
        parse_http("http://h/x", [], header_names=["Idempotency-Key"])


def test_the_secret_is_read_without_its_newline_and_never_shown(tmp_path: object,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CDC_RELAY_TEST_SECRET", "abc\n")
    config = parse_http("http://h/x", ["signing_secret_env=CDC_RELAY_TEST_SECRET"])
    assert config.signing_secret == b"abc" and "abc" not in repr(config)


class Answer:
    def __init__(self, status: int, retry_after: str | None = None) -> None:
        self.status_code, self.text = status, "no"
        self.headers = {"Retry-After": retry_after} if retry_after else {}


class FakeHttp:
    """Answers from a script per event id (the default: 200), recording what was sent."""

    def __init__(self, script: dict[str, list[Answer]]) -> None:
        self.script, self.sent = script, []  # type: ignore[var-annotated]

    def request(self, method: str, url: str, content: bytes, headers: dict[str, str]) -> Answer:
        self.sent.append(headers["Idempotency-Key"])
        answers = self.script.get(headers["Idempotency-Key"], [])
        return answers.pop(0) if answers else Answer(200)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def drive(sink: HttpSink, clock: Clock, rounds: int) -> list[float]:
    """Send one request per round; when none is ready, move the clock to the next entry's
    time. Return how far the clock was moved each time."""
    waits = []
    for _ in range(rounds):
        with sink._cond:
            batch = sink._planner.take(clock(), {}, 1 << 20)
        if batch:
            sink._send(batch, [sink._items[p.seq] for p in batch])
            continue
        later = [e.not_before for q in sink._planner.waiting.values() for e in q
                 if e.not_before > clock.now]
        if later:
            waits.append(min(later) - clock.now)
            clock.now = min(later)
    return waits


def http_sink(script: dict[str, list[Answer]],
              *items: str) -> tuple[HttpSink, FakeHttp, Clock, list[Delivery]]:
    got: list[Delivery] = []
    clock = Clock()
    sink = HttpSink(parse_http("http://h/{aggregate_type}", list(items)), collect(got), clock=clock)
    fake = FakeHttp(script)
    sink._client = fake
    return sink, fake, clock, got


def test_a_503_with_retry_after_holds_back_its_aggregates_later_events_only() -> None:
    sink, fake, clock, got = http_sink({"e-1": [Answer(503, "7")]})
    for token, (n, key) in enumerate([(1, "A"), (2, "A"), (3, "B")]):
        sink.produce(message(n, key=key), token)
    waits = drive(sink, clock, rounds=6)
    sink.poll(0)
    assert fake.sent == ["e-1", "e-3", "e-1", "e-2"]  # e-2 only after e-1 was delivered
    assert waits == [7.0]  # Retry-After honoured
    assert [d.token for d in got] == [2, 0, 1] and all(d.error is None for d in got)


def test_a_422_is_sent_max_attempts_times_then_a_permanent_error_naming_the_status() -> None:
    sink, fake, clock, got = http_sink({"e-1": [Answer(422)] * 5}, "max_attempts=2")
    sink.produce(message(1), 0)
    drive(sink, clock, rounds=4)
    sink.poll(0)
    assert fake.sent == ["e-1", "e-1"]
    [refused] = got
    assert refused.error is not None and refused.error.kind is ErrorKind.PERMANENT
    assert "answered 422 2 times" in refused.error.reason


def test_a_413_for_one_event_is_too_large_at_once() -> None:
    sink, _, clock, got = http_sink({"e-1": [Answer(413)]})
    sink.produce(message(1), 0)
    drive(sink, clock, rounds=1)
    sink.poll(0)
    assert got[0].error is not None and got[0].error.cause is Cause.TOO_LARGE
