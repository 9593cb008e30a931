"""The outbox table as ``cdc-relay init`` creates it, on Django's connection.

Runs cdc_relay.pg.schema.apply_migrations (the sql/ migrations and their bookkeeping) in the
migration's transaction. Reversing it leaves the tables in place: they hold events the
relay may not have published yet, and other services may share them.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db import migrations


def apply_outbox(apps: Any, schema_editor: Any) -> None:
    """Apply cdc-relay's sql/ migrations on the migration's connection (psycopg 3 only)."""
    import psycopg
    from django.conf import settings

    from cdc_relay.integrations.django import outbox_config
    from cdc_relay.pg.schema import apply_migrations

    connection = schema_editor.connection
    if connection.vendor != "postgresql":
        raise ImproperlyConfigured(f"cdc_relay's outbox needs PostgreSQL, not {connection.vendor}")
    connection.ensure_connection()
    raw = connection.connection
    if not isinstance(raw, psycopg.Connection):
        raise ImproperlyConfigured(
            "cdc_relay's outbox migration needs Django's PostgreSQL backend on psycopg 3: "
            "pip install 'cdc-relay[django]' (it brings psycopg 3; Django prefers it to psycopg2)"
        )
    apply_migrations(raw, outbox_config(),
                     trace_context=bool(getattr(settings, "CDC_RELAY_TRACE_CONTEXT", False)))


class Migration(migrations.Migration):  # type: ignore[misc]  # Django ships no type hints
    initial = True
    dependencies: list[tuple[str, str]] = []
    operations = [migrations.RunPython(apply_outbox, migrations.RunPython.noop, elidable=False)]
