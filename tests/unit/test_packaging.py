"""The wheel ships every subpackage and the SQL migrations (pyproject lists them)."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_subpackage_and_the_sql_directory_are_packaged() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    on_disk = {
        ".".join(path.parent.relative_to(ROOT).parts)
        for path in (ROOT / "cdc_relay").rglob("__init__.py")
    }
    assert on_disk <= listed, f"missing from pyproject packages: {sorted(on_disk - listed)}"
    assert config["package-dir"]["cdc_relay.sql"] == "sql"
    assert config["package-data"]["cdc_relay.sql"] == ["*.sql"]
    assert list((ROOT / "sql").glob("0001_*.sql"))
