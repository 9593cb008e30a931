"""The decoders' compiled entry point (decoding/_coutbox.h ``Decode``; docs/design.md, "The
compiled decoders"): the position made an Lsn, the fast path first, the pure one after,
the last position remembered - in both modules that export it.

They fail, not skip, when the extensions are not built: CI has a compiler.
"""

from __future__ import annotations

import gc
import sys
import weakref
from typing import Any

import pytest

from cdc_relay.config import TableRef
from cdc_relay.decoding import _cpgoutput, _cwal2json
from cdc_relay.decoding.wal2json import Wal2JsonDecoder
from cdc_relay.model import Lsn, OutboxColumns, OutboxEvent
from tests.unit.paths import built
from tests.unit.test_decoding_wal2json import insert_message, outbox_row

MODULES = pytest.mark.parametrize("module", [_cpgoutput, _cwal2json], ids=["pgoutput", "wal2json"])
POSITIONS = [0, 1, 2**30 - 1, 2**30, 0x16B374D848, 2**60 + 3, 2**64 - 1]


class Recorder:
    def __init__(self, answer: Any = None) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.answer = answer

    def __call__(self, *args: Any) -> Any:
        self.calls.append(args)
        return self.answer


@MODULES
@pytest.mark.parametrize("position", POSITIONS)
def test_the_position_reaches_both_paths_as_an_equal_lsn(module: Any, position: int) -> None:
    fast, slow = Recorder(), Recorder("slow's answer")
    decode = module.Decode(fast, slow, Lsn)
    assert decode(b"payload", position) == "slow's answer"
    [(payload, lsn)] = fast.calls
    assert slow.calls == fast.calls and payload == b"payload"
    assert type(lsn) is Lsn and lsn == position and str(lsn) == str(Lsn(position))
    assert hash(lsn) == hash(position)


@MODULES
def test_positions_in_a_row_each_become_their_own_lsn(module: Any) -> None:
    """The argument tuple for int's constructor is reused between calls: every Lsn still
    has its own position, whoever holds the earlier ones; the tuple keeps only the latest."""
    fast = Recorder()
    decode = module.Decode(fast, Recorder(), Lsn)
    positions = [*POSITIONS, *reversed(POSITIONS), 7, 7, 2**40]
    for position in positions:
        decode(b"", position)
    made = [lsn for _, lsn in fast.calls]
    assert made == positions and all(type(lsn) is Lsn for lsn in made)
    position = int("1234567890123")  # an int object of its own
    before = sys.getrefcount(position)
    decode(b"", position)
    decode(b"", 5)
    assert sys.getrefcount(position) == before  # the reused tuple let it go


@MODULES
def test_an_lsn_is_passed_on_as_it_is_and_the_fast_answer_wins(module: Any) -> None:
    fast, slow = Recorder("event"), Recorder()
    at = Lsn(0x1234)
    assert module.Decode(fast, slow, Lsn)(b"x", at) == "event"
    assert fast.calls[0][1] is at and slow.calls == []


@MODULES
def test_the_last_non_zero_position_is_remembered(module: Any) -> None:
    decode = module.Decode(Recorder(), Recorder(), Lsn)
    assert decode.position == Lsn(0) and type(decode.position) is Lsn
    decode(b"", 0x500)
    decode(b"", 0)  # pgoutput's messages without a position do not forget it
    assert decode.position == Lsn(0x500)
    decode(b"", Lsn(0x700))
    assert decode.position == Lsn(0x700)


@MODULES
def test_what_either_path_raises_reaches_the_caller(module: Any) -> None:
    def boom(payload: bytes, lsn: Lsn) -> None:
        raise ValueError(f"failed at {lsn}")

    with pytest.raises(ValueError, match="failed at 0/10"):
        module.Decode(boom, Recorder(), Lsn)(b"", 0x10)
    with pytest.raises(ValueError, match="failed at 0/20"):
        module.Decode(Recorder(), boom, Lsn)(b"", 0x20)


@MODULES
def test_bad_arguments_are_refused(module: Any) -> None:
    decode = module.Decode(Recorder(), Recorder(), Lsn)
    with pytest.raises(TypeError):
        decode(b"", "0/10")
    with pytest.raises(TypeError):
        decode(b"")
    with pytest.raises(TypeError):
        decode(b"", 1, extra=2)

    class Wide(int):  # an int subclass with a field of its own cannot be built by copy
        pass

    with pytest.raises(TypeError):
        module.Decode(Recorder(), Recorder(), Wide)
    with pytest.raises(TypeError):
        module.Decode(Recorder(), Recorder(), str)

    class Made(int):  # a constructor of its own: int's, which Decode calls, is not its
        __slots__ = ()

        def __new__(cls, value: int) -> Made:
            return super().__new__(cls, value + 1)

    with pytest.raises(TypeError):
        module.Decode(Recorder(), Recorder(), Made)
    with pytest.raises(TypeError):
        module.Decode(None, Recorder(), Lsn)


@MODULES
def test_a_decoder_and_its_entry_in_a_cycle_are_collected(module: Any) -> None:
    class Decoder:
        def __init__(self) -> None:
            self.entry = module.Decode(Recorder(), self.slow, Lsn)

        def slow(self, payload: bytes, lsn: Lsn) -> None:
            return None

    decoder = Decoder()
    gone = weakref.ref(decoder)
    del decoder
    gc.collect()
    assert gone() is None


def counting(decoder: Wal2JsonDecoder) -> Recorder:
    """Route the decoder's entry through a counter of what reaches the pure path."""
    slow = decoder._decode
    seen = Recorder()

    def counted(payload: bytes, lsn: Lsn) -> Any:
        seen(payload, lsn)
        return slow(payload, lsn)

    assert decoder._reader is not None
    entry = _cwal2json.Decode(decoder._reader.row, counted, Lsn)
    decoder._compiled_entry = entry
    decoder._entry = entry
    return seen


def test_wal2json_rows_go_compiled_again_once_the_pure_path_has_planned_a_new_shape() -> None:
    decoder = built(True, Wal2JsonDecoder, TableRef("public", "outbox_events"), OutboxColumns())
    seen = counting(decoder)
    first = decoder.decode(insert_message(outbox_row()), 0x100)
    assert isinstance(first, OutboxEvent) and len(seen.calls) == 1  # a shape's first row: pure
    second = decoder.decode(insert_message(outbox_row(id="e-1")), 0x180)
    assert isinstance(second, OutboxEvent) and second.id == "e-1" and len(seen.calls) == 1

    def moved(event_id: str) -> bytes:  # the same row with its columns in another order (DDL)
        return insert_message(dict(reversed(list(outbox_row(id=event_id).items()))))

    third = decoder.decode(moved("e-2"), 0x200)
    assert isinstance(third, OutboxEvent) and third.id == "e-2" and len(seen.calls) == 2
    fourth = decoder.decode(moved("e-3"), 0x300)
    assert isinstance(fourth, OutboxEvent) and fourth.id == "e-3" and fourth.lsn == Lsn(0x300)
    assert len(seen.calls) == 2  # the new plan reached the Reader: compiled again
