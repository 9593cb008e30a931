"""What the boto3 clients of the SQS and Kinesis sinks share (sink/sqs/client.py, sink/kinesis/client.py).

Owns building a boto3 client (credentials from boto3's standard chain, botocore's timeouts
and retries), an error's AWS code, and how a refusal of the credentials or permissions
reads (``AccessRefused``, exit 6, with the service's IAM fix). Which codes are a refusal,
the region and the fix are each sink's. Must not send anything.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, Protocol

import boto3
import botocore.config
import botocore.exceptions

from cdc_relay.errors import AccessRefused, ConfigError, mask_secrets
from cdc_relay.text import shorten


class AwsSettings(Protocol):
    """What an AWS sink's config gives its client (``SqsConfig``, ``KinesisConfig``)."""

    @property
    def endpoint_url(self) -> str | None: ...
    @property
    def profile(self) -> str | None: ...
    @property
    def concurrency(self) -> int: ...
    @property
    def connect_timeout(self) -> float: ...
    @property
    def read_timeout(self) -> float: ...


def make_aws_client(service: str, config: AwsSettings, *, region: str | None, no_region: str,
                    max_attempts: int) -> Any:
    """A boto3 ``service`` client; ConfigError ``no_region`` when boto3 finds no region either."""
    try:
        session = boto3.session.Session(profile_name=config.profile, region_name=region)
    except botocore.exceptions.ProfileNotFound as exc:
        raise ConfigError(f"--sink-config profile={config.profile}: {exc}") from exc
    if session.region_name is None:
        raise ConfigError(no_region)
    settings = botocore.config.Config(
        connect_timeout=config.connect_timeout, read_timeout=config.read_timeout,
        retries={"max_attempts": max_attempts, "mode": "standard"},
        max_pool_connections=config.concurrency + 2)
    return session.client(service, endpoint_url=config.endpoint_url, config=settings)


def error_code(exc: BaseException) -> str:
    """The AWS error code of a ClientError ('' for anything else)."""
    if isinstance(exc, botocore.exceptions.ClientError):
        return str(exc.response.get("Error", {}).get("Code", ""))
    return ""


def aws_refusal(exc: BaseException, who: str, refused: Collection[str],
                fix: str) -> AccessRefused | None:
    """AccessRefused (``who``: "SQS at WHERE") when ``exc`` says the credentials or
    permissions were refused: no credentials, a code of ``refused``, or a 403."""
    if isinstance(exc, botocore.exceptions.NoCredentialsError):
        return AccessRefused(f"{who}: no AWS credentials found; {fix}")
    response = getattr(exc, "response", None)  # None on some botocore errors (timeouts)
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode") if isinstance(
        response, dict) else None
    if error_code(exc) in refused or status == 403:  # 403: a refusal whose body was unparsed
        text = shorten(" ".join(mask_secrets(str(exc)).split()), 300)
        return AccessRefused(f"{who} refused the relay: {text}; {fix}")
    return None
