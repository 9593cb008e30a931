"""The application side for SQLAlchemy, asyncpg and Django (docs/application-side.md).

Each submodule is an optional extra (``cdc-relay[sqlalchemy]``, ``[asyncpg]``,
``[django]``) and an adapter over the shared core, cdc_relay/outbox_core.py: the checks,
ids, trace context and statements are the core's, only the ``execute`` call is the
library's. Importing a submodule without its library raises one ImportError line that
names the extra to install.

Must not: import any of those libraries here (a user of one must not need the others),
or open connections, transactions or commits of its own.
"""

from __future__ import annotations


def missing(library: str, extra: str) -> ImportError:
    """The ImportError of an integration whose library is not installed."""
    return ImportError(
        f"cdc_relay.integrations.{extra} needs {library}: pip install 'cdc-relay[{extra}]'"
    )
