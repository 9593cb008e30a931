"""Builds the PostgreSQL password provider from the configuration (config at the edge).

Owns turning ``CredentialsConfig`` and the DSN into a ``PasswordProvider``
(pg/credentials.py) - a ``CommandPassword``, or an ``RdsIamToken`` over boto3's
``generate_db_auth_token`` with the region from ``--aws-region`` or boto3's standard
chain, refusing an ``sslmode`` weaker than ``require`` - and ``credentials_for``, which
installs it (pg/db.py) for a command's whole run. boto3 is the optional ``sqs`` extra:
imported only here, only for ``--aws-rds-iam``. Must not open a connection or log a
password.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import pq
from psycopg.conninfo import conninfo_to_dict

from cdc_relay.config import CredentialsConfig
from cdc_relay.errors import ConfigError
from cdc_relay.pg.credentials import (
    CommandPassword,
    PasswordProvider,
    RdsIamToken,
    TokenFunction,
    require_tls,
)
from cdc_relay.pg.db import password_provider


def dsn_sslmode(dsn: str) -> str | None:
    """The sslmode a DSN connects with, as libpq decides it (the DSN, else PGSSLMODE)."""
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:
        raise ConfigError(f"invalid DSN: {exc}") from exc
    if params.get("sslmode"):
        return str(params["sslmode"])
    defaults = {o.keyword: o.val for o in pq.Conninfo.get_defaults()}
    found = defaults.get(b"sslmode")
    return found.decode() if found else None


def boto3_token_function(region: str | None) -> tuple[TokenFunction, str]:
    """boto3's ``generate_db_auth_token`` and the region it signs for."""
    try:
        import boto3
    except ImportError as exc:
        raise ConfigError("--aws-rds-iam needs boto3: pip install 'cdc-relay[sqs]' "
                          "(or pip install boto3)") from exc
    session = boto3.session.Session(region_name=region)
    if session.region_name is None:
        raise ConfigError("no AWS region for --aws-rds-iam: pass --aws-region REGION or set "
                          "AWS_REGION (the database's region)")
    client: Any = session.client("rds")

    def token(host: str, port: int, user: str, signing_region: str) -> str:
        return str(client.generate_db_auth_token(DBHostname=host, Port=port, DBUsername=user,
                                                 Region=signing_region))

    return token, str(session.region_name)


def build_provider(config: CredentialsConfig, dsn: str, *,
                   token_function: TokenFunction | None = None) -> PasswordProvider | None:
    """The provider ``config`` asks for (None: the DSN's own password).

    ``token_function`` replaces boto3's (tests: no AWS here); the region is then
    ``--aws-region`` as given.
    """
    if config.password_command:
        return CommandPassword(config.password_command)
    if not config.aws_rds_iam:
        return None
    require_tls(dsn_sslmode(dsn))
    if token_function is not None:
        if config.aws_region is None:
            raise ConfigError("no AWS region for --aws-rds-iam: pass --aws-region REGION")
        return RdsIamToken(token_function, config.aws_region)
    token, region = boto3_token_function(config.aws_region)
    return RdsIamToken(token, region)


@contextmanager
def credentials_for(config: CredentialsConfig, dsn: str) -> Iterator[None]:
    """Every connection opened inside takes its password from ``config``'s provider."""
    with password_provider(build_provider(config, dsn)):
        yield
