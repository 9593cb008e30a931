"""The session's reader of changes (docs/design.md, "The compiled reader"): the stream's
compiled one (wal/stream/_cstream.c) against its pure twin, protocol.read_changes over
ReplicationStream.read, on the same scripted libpq answers - rows, keepalives, a
header-only XLogData, nothing buffered, the end of the stream, libpq errors.

They fail, not skip, when the extension is not built: CI has a compiler.
"""

from __future__ import annotations

import gc
import struct
import weakref
from typing import Any

import psycopg
import pytest

from cdc_relay.config import ReplicationConfig
from cdc_relay.errors import DecodeError, SourceLost
from cdc_relay.wal.stream import _cstream
from cdc_relay.wal.stream.protocol import KEEPALIVE, NO_CHANGE, XLOG_DATA, read_changes
from cdc_relay.wal.stream.replication import ReplicationStream

PATHS = pytest.mark.usefixtures("compiled")  # both paths (tests/conftest.py)


def xlogdata(position: int, payload: bytes) -> bytes:
    return b"w" + struct.pack("!QQq", position, 0, 123) + payload


def keepalive(wal_end: int, reply: bool) -> bytes:
    return b"k" + struct.pack("!QqB", wal_end, 456, int(reply))


class ScriptedPgconn:
    """What psycopg's get_copy_data(1) answers, in turn: a message (as a memoryview, as
    psycopg gives it), nothing (b""), the end (-1) or an exception to raise."""

    error_message = b"server closed the stream"

    def __init__(self, *answers: bytes | int | BaseException, as_bytes: bool = False) -> None:
        self.answers = list(answers)
        self.as_bytes = as_bytes  # as psycopg's pure-Python libpq wrapper gives a message
        self.calls: list[int] = []

    def get_copy_data(self, async_: int) -> tuple[int, memoryview | bytes]:
        self.calls.append(async_)
        answer = self.answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        if isinstance(answer, int):
            return answer, b""
        if self.as_bytes or not answer:
            return len(answer), answer
        return len(answer), memoryview(answer)


class Decoder:
    """Answers each payload from a table (None: decodes to nothing), recording the calls."""

    def __init__(self, answers: dict[bytes, Any]) -> None:
        self.answers = answers
        self.calls: list[tuple[bytes, int]] = []

    def __call__(self, payload: bytes | memoryview, position: int) -> Any:
        self.calls.append((bytes(payload), position))
        answer = self.answers[bytes(payload)]
        if isinstance(answer, Exception):
            raise answer
        return answer


def reader(pgconn: ScriptedPgconn, decode: Decoder, compiled: bool) -> tuple[Any, ReplicationStream]:
    stream = ReplicationStream(ReplicationConfig(dsn="host=127.0.0.1 dbname=x"), [])
    stream._pgconn = pgconn  # type: ignore[assignment]
    changes = stream.changes(decode)
    assert (type(changes) is _cstream.Changes) is compiled
    return changes, stream


@PATHS
@pytest.mark.parametrize("as_bytes", [False, True], ids=["memoryview", "bytes"])
def test_rows_are_decoded_with_their_position_keepalives_come_as_they_are(
        compiled: bool, as_bytes: bool) -> None:
    pgconn = ScriptedPgconn(xlogdata(0x16B374D848, b"row-1"), keepalive(0x500, True), b"",
                            xlogdata(2**64 - 1, b"relation"), xlogdata(7, b"row-2"),
                            keepalive(0x600, False), as_bytes=as_bytes)
    decode = Decoder({b"row-1": "event 1", b"relation": None, b"row-2": "event 2"})
    changes, _ = reader(pgconn, decode, compiled)
    got = [changes() for _ in range(6)]
    assert got == ["event 1", (KEEPALIVE, 0x500, True), None, NO_CHANGE, "event 2",
                   (KEEPALIVE, 0x600, False)]
    assert decode.calls == [(b"row-1", 0x16B374D848), (b"relation", 2**64 - 1), (b"row-2", 7)]
    assert all(type(position) is int for _, position in decode.calls)
    assert pgconn.calls == [1] * 6  # never the blocking form


@PATHS
def test_an_xlogdata_without_a_payload_is_decoded_as_the_pure_path_does(compiled: bool) -> None:
    decode = Decoder({b"": None})
    changes, _ = reader(ScriptedPgconn(xlogdata(0x42, b"")), decode, compiled)
    assert changes() is NO_CHANGE
    assert decode.calls == [(b"", 0x42)]


@PATHS
def test_the_end_of_the_stream_is_a_lost_source_naming_libpq_s_reason(compiled: bool) -> None:
    changes, _ = reader(ScriptedPgconn(-1), Decoder({}), compiled)
    with pytest.raises(SourceLost, match="replication stream ended: server closed the stream"):
        changes()


@PATHS
def test_a_libpq_error_is_a_lost_source_and_anything_else_goes_as_it_came(compiled: bool) -> None:
    pgconn = ScriptedPgconn(psycopg.OperationalError("consuming input failed: password=hunter2"),
                            RuntimeError("a bug"), KeyboardInterrupt())
    changes, _ = reader(pgconn, Decoder({}), compiled)
    with pytest.raises(SourceLost, match="replication connection lost") as lost:
        changes()
    assert "hunter2" not in str(lost.value)
    assert isinstance(lost.value.__cause__, psycopg.OperationalError)
    with pytest.raises(RuntimeError, match="a bug"):
        changes()
    with pytest.raises(KeyboardInterrupt):
        changes()


@PATHS
def test_a_decoder_error_and_an_unknown_message_are_raised_unchanged(compiled: bool) -> None:
    pgconn = ScriptedPgconn(xlogdata(5, b"bad"), b"z-unknown")
    changes, _ = reader(pgconn, Decoder({b"bad": DecodeError("cannot decode")}), compiled)
    with pytest.raises(DecodeError, match="cannot decode"):
        changes()
    with pytest.raises(DecodeError, match="unknown replication message type 'z'"):
        changes()


@PATHS
def test_a_truncated_message_is_a_decode_error(compiled: bool) -> None:
    changes, _ = reader(ScriptedPgconn(b"w" + bytes(10), b"k" + bytes(3)), Decoder({}), compiled)
    with pytest.raises(DecodeError, match="truncated XLogData"):
        changes()
    with pytest.raises(DecodeError, match="truncated keepalive"):
        changes()


def test_the_pure_reader_decodes_what_a_source_reads() -> None:
    script = [(XLOG_DATA, 3, memoryview(b"row")), None, (KEEPALIVE, 9, False)]
    decode = Decoder({b"row": None})
    changes = read_changes(lambda: script.pop(0), decode)
    assert [changes(), changes(), changes()] == [NO_CHANGE, None, (KEEPALIVE, 9, False)]
    assert decode.calls == [(b"row", 3)]


def test_the_compiled_reader_refuses_bad_arguments_and_answers() -> None:
    def message(nbytes: int, data: object) -> Any:
        return "not a tuple"

    def failed(exc: Exception) -> None:
        return None  # does not raise: the original exception stands

    with pytest.raises(TypeError, match="must be callable"):
        _cstream.Changes(None, print, message, failed, NO_CHANGE)
    with pytest.raises(TypeError, match="cannot be None"):
        _cstream.Changes(print, print, message, failed, None)
    with pytest.raises(TypeError, match="not initialised"):
        _cstream.Changes.__new__(_cstream.Changes)()
    with pytest.raises(TypeError, match="takes no arguments"):
        _cstream.Changes(print, print, message, failed, NO_CHANGE)(1)
    with pytest.raises(TypeError, match="get_copy_data"):
        _cstream.Changes(lambda _: "x", print, message, failed, NO_CHANGE)()
    with pytest.raises(TypeError, match="message\\(\\) must return"):
        _cstream.Changes(lambda _: (5, b"k" * 5), print, message, failed, NO_CHANGE)()

    def huge_kind(nbytes: int, data: object) -> Any:
        return (2**70, 0, False)

    with pytest.raises(OverflowError):
        _cstream.Changes(lambda _: (5, b"k" * 5), print, huge_kind, failed, NO_CHANGE)()

    def broken(_: int) -> tuple[int, bytes]:
        raise ValueError("original")

    with pytest.raises(ValueError, match="original"):
        _cstream.Changes(broken, print, message, failed, NO_CHANGE)()


def test_the_compiled_reader_and_its_stream_are_collected() -> None:
    pgconn = ScriptedPgconn()
    changes, stream = reader(pgconn, Decoder({}), True)
    stream.kept = changes  # type: ignore[attr-defined]  # a cycle through the stream's methods
    gone = weakref.ref(stream)
    del changes, stream
    gc.collect()
    assert gone() is None
