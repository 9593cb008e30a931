"""The Django app of the outbox integration (its label: ``cdc_relay``; docs/application-side.md).

Must not: define models or signals; the migration is the whole app.
"""

from __future__ import annotations

from django.apps import AppConfig


class CdcRelayConfig(AppConfig):  # type: ignore[misc]  # Django ships no type hints
    """``"cdc_relay.integrations.django"`` in ``INSTALLED_APPS``."""

    name = "cdc_relay.integrations.django"
    label = "cdc_relay"
    verbose_name = "cdc-relay outbox"
