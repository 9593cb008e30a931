"""Helpers of the integration tests of cdc_relay.integrations (docs/application-side.md):
SQLAlchemy URLs of a test DSN, the outbox rows, and Django in a subprocess of its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

PAYLOAD = {"order": "o-1", "total": 12.5, "name": "Zoë — 東京"}
ROOT = Path(__file__).resolve().parents[2]


def url(dsn: str, driver: str) -> str:
    """The SQLAlchemy URL of a libpq DSN, for ``driver`` (psycopg or asyncpg)."""
    p = conninfo_to_dict(dsn)
    return f"postgresql+{driver}://{p['user']}@{p['host']}:{p['port']}/{p['dbname']}"


def rows(dsn: str, query: str = "SELECT id, aggregate_type, aggregate_id, event_type, payload "
         "FROM outbox_events ORDER BY created_at") -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(query).fetchall()


# Django configured for the database of argv[1:5]; a script's own arguments follow.
DJANGO_SETUP = """
import json, sys, uuid
import django
from django.conf import settings
settings.configure(
    INSTALLED_APPS=["cdc_relay.integrations.django"],
    DATABASES={"default": {"ENGINE": "django.db.backends.postgresql", "NAME": sys.argv[1],
                           "HOST": sys.argv[2], "PORT": sys.argv[3], "USER": sys.argv[4]}},
    USE_TZ=True,
)
django.setup()
"""

DJANGO_SCRIPT = DJANGO_SETUP + """
from django.core.management import call_command
from django.db import transaction
from cdc_relay.integrations.django import emit, process_once
from cdc_relay.outbox_core import TransactionRequired

call_command("migrate", verbosity=0)
call_command("migrate", verbosity=0)  # a second run changes nothing
try:
    with transaction.atomic():
        emit("order", "o-0", "dropped", {"n": 0})
        raise RuntimeError("roll back")
except RuntimeError:
    pass
given = "1b4e28ba-2fa1-11d2-883f-0016d3cca427"  # an event id as text is accepted
with transaction.atomic():
    event_id = emit("order", "o-1", "created", {"n": 1}, id=given)
    assert event_id == uuid.UUID(given), event_id
    first = process_once(event_id)
with transaction.atomic():
    duplicate = process_once(event_id)
try:
    process_once(uuid.uuid4())
    outside = "accepted"
except TransactionRequired as exc:
    outside = str(exc)
print(json.dumps({"id": str(event_id), "marks": [first, duplicate], "outside": outside}))
"""


def run_django(dsn: str, script: str = DJANGO_SCRIPT, *args: str) -> dict[str, Any]:
    """Run ``script`` (after ``DJANGO_SETUP``) in a Python of its own; its last line's JSON."""
    p = conninfo_to_dict(dsn)
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), p["dbname"], p["host"],
         p["port"], p["user"], *args],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr
    found: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return found
