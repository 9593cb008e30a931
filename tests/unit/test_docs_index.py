"""README is read once: short, and its index lists every user document."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_readme_is_short_and_indexes_every_doc() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 100
    missing = [p.name for p in sorted((ROOT / "docs").glob("*.md"))
               if f"(docs/{p.name})" not in readme]
    assert missing == []
    for name in ("LICENSE", "CHANGELOG.md"):
        assert (ROOT / name).is_file() and f"({name})" in readme


def test_exit_codes_have_one_table() -> None:
    tables = [p.name for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
              if p.name != "design.md"
              and "| 5 | DEAD_LETTER_REFUSED" in p.read_text(encoding="utf-8")]
    assert tables == ["operations.md"]


def test_the_operations_metrics_table_lists_every_metric() -> None:
    import re

    source = "\n".join(p.read_text(encoding="utf-8")
                       for p in (ROOT / "cdc_relay" / "ops" / "metrics").glob("*.py"))
    names = set(re.findall(r'"((?:outbox|cdc_relay)_[a-z_]+)"', source))
    table = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    assert names and sorted(n for n in names if n not in table) == []
