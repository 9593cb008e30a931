"""The benchmark byte-compiles the code under test, as pip does when it installs it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from benchmarks.procs import byte_compile, code_under_test


def test_byte_compile_writes_the_pyc_files_even_when_python_would_not(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("X = 1\n")
    (package / "sub" / "mod.py").write_text("Y = 2\n")
    monkeypatch.setattr(sys, "dont_write_bytecode", True)  # PYTHONDONTWRITEBYTECODE=1
    byte_compile(package)
    for source in (package / "__init__.py", package / "sub" / "mod.py"):
        assert Path(importlib.util.cache_from_source(str(source))).is_file()


def test_a_package_that_does_not_compile_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "bad.py").write_text("def (:\n")
    with pytest.raises(RuntimeError, match="cannot byte-compile"):
        byte_compile(tmp_path)


def test_the_code_under_test_is_the_relay_and_the_harness() -> None:
    relay, harness = code_under_test()
    assert (relay / "wal" / "stream" / "session.py").is_file()
    assert (harness / "classic.py").is_file()
