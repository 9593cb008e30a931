"""The instruction counter reads callgrind's files and says plainly when valgrind is missing."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import instructions


def _write(path: Path, total: int, word: str = "summary") -> None:
    path.write_text(f"# callgrind format\nversion: 1\ncmd: python\n{word}: {total}\n")


def test_totals_add_the_threads_and_name_the_main_one(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    annotated: list[Path] = []
    monkeypatch.setattr(instructions, "_parts", lambda path: annotated.append(path) or {"x": 1})
    prefix = tmp_path / "callgrind-slot"
    _write(tmp_path / "callgrind-slot.4242-01", 1_000)
    _write(tmp_path / "callgrind-slot.4242-02", 300, "totals")
    _write(tmp_path / "callgrind-slot.4242-03", 20)
    (tmp_path / "callgrind-slot.4242").write_text("")  # the process's own file, empty
    _write(tmp_path / "callgrind-other.4242-01", 99_999)  # another run's file is not counted
    assert instructions._totals(prefix) == {"main": 1_000, "process": 1_320, "threads": 3,
                                            "parts": {"x": 1}}
    assert annotated == [tmp_path / "callgrind-slot.4242-01"], "the main thread is broken down"


def test_the_breakdown_reads_callgrind_annotate_listings() -> None:
    listing = """\
--------------------------------------------------------------------------------
2,107,256,320 (21.50%)  ???:Producer_poll [/venv/confluent_kafka/cimpl.so]
  682,724,230 ( 6.97%)  /src/cdc_relay/decoding/_cpgoutput.c:reader_insert [/src/_cpgoutput.so]
   66,375,040 ( 0.68%)  /src/cdc_relay/decoding/_ctimestamp.h:reader_insert
2,286,017,909 (23.33%)  /py/Python/ceval.c:_PyEval_EvalFrameDefault'2 [/py/libpython3.11.so]
   64,080,880 ( 0.65%)  /py/Include/object.h:_PyEval_EvalFrameDefault'2
      900,000 ( 0.01%)  /py/Python/ceval.c:_PyEval_EvalFrameDefault [/py/libpython3.11.so]
    .           static PyObject *reader_insert(Reader *self, PyObject *const *args)
"""
    assert instructions.annotated(listing, inclusive=True) == {
        "Producer_poll": 2_107_256_320, "reader_insert": 682_724_230}
    assert instructions.annotated(listing, inclusive=False) == {
        "_PyEval_EvalFrameDefault": 2_286_017_909 + 64_080_880 + 900_000}


def test_a_run_without_a_count_for_the_main_thread_is_an_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _write(tmp_path / "callgrind-slot.4242-02", 300)
    monkeypatch.setattr(instructions, "_parts", lambda _path: {})
    with pytest.raises(RuntimeError, match="main thread"):
        instructions._totals(tmp_path / "callgrind-slot")


def test_per_event_counts_are_tabled_per_plugin() -> None:
    results = {"events": 20_000, "machine": {"git_commit": "abc1234"}, "plugins": {
        "pgoutput": {"idle": {"main": 900_000_000}, "main_per_event": 41_234,
                     "process_per_event": 44_000,
                     "main_parts_per_event": {"Producer_produce": 5_900,
                                              "_PyEval_EvalFrameDefault": 11_000}}}}
    text = instructions.table(results)
    assert "20,000-event backlog" in text and "abc1234" in text
    assert "| pgoutput | 41,234 | 44,000 | 900,000,000 |" in text
    assert "- produce (confluent-kafka, librdkafka): 5,900" in text
    assert "- Python bytecode (the evaluation loop itself): 11,000" in text


def test_missing_valgrind_is_one_clear_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(instructions.shutil, "which", lambda _name: None)
    with pytest.raises(RuntimeError, match=r"^valgrind is not installed \(apt-get install valgrind\)"):
        instructions.valgrind()
