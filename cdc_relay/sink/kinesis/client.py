"""The boto3 Kinesis client of the kinesis sink and how its errors read (sink/kinesis/sink.py, probe.py).

Owns building the client from ``KinesisConfig`` (credentials and region from boto3's
standard chain), an error's AWS code, and which errors are a refusal of the credentials or
permissions (``AccessRefused``, exit 6, with the IAM fix). Must not send anything.
"""

from __future__ import annotations

from typing import Any

import boto3
import botocore.config
import botocore.exceptions

from cdc_relay.errors import AccessRefused, ConfigError, mask_secrets
from cdc_relay.sink.kinesis.config import KinesisConfig
from cdc_relay.text import shorten

MISSING = ("ResourceNotFoundException",)
_REFUSED = ("AccessDenied", "AccessDeniedException", "InvalidClientTokenId",
            "SignatureDoesNotMatch", "UnrecognizedClientException", "ExpiredTokenException",
            "ExpiredToken", "MissingAuthenticationToken", "InvalidAccessKeyId",
            "KMSAccessDeniedException", "IncompleteSignature")
IAM_FIX = ("grant kinesis:PutRecords and kinesis:DescribeStreamSummary on the streams (and "
           "kms:GenerateDataKey on a stream's customer key), and check the credentials boto3 "
           "finds (AWS_ACCESS_KEY_ID/AWS_PROFILE/the instance role)")


def make_client(config: KinesisConfig) -> Any:
    """A boto3 Kinesis client for the config; credentials and region from boto3's standard chain."""
    try:
        session = boto3.session.Session(profile_name=config.profile, region_name=config.region)
    except botocore.exceptions.ProfileNotFound as exc:
        raise ConfigError(f"--sink-config profile={config.profile}: {exc}") from exc
    if session.region_name is None:
        raise ConfigError("no AWS region for the kinesis sink: use --brokers kinesis://REGION, "
                          "--sink-config region=REGION, or AWS_REGION")
    settings = botocore.config.Config(
        connect_timeout=config.connect_timeout, read_timeout=config.read_timeout,
        retries={"max_attempts": 1, "mode": "standard"},
        max_pool_connections=config.concurrency + 2)
    return session.client("kinesis", endpoint_url=config.endpoint_url, config=settings)


def error_code(exc: BaseException) -> str:
    """The AWS error code of a ClientError ('' for anything else)."""
    if isinstance(exc, botocore.exceptions.ClientError):
        return str(exc.response.get("Error", {}).get("Code", ""))
    return ""


def refusal(exc: BaseException | str, where: str) -> AccessRefused | None:
    """AccessRefused when ``exc`` (or a record's ErrorCode) says the credentials or
    permissions were refused."""
    if isinstance(exc, str):
        return (AccessRefused(f"Kinesis at {where} refused a record: {exc}; {IAM_FIX}")
                if exc in _REFUSED else None)
    if isinstance(exc, botocore.exceptions.NoCredentialsError):
        return AccessRefused(f"Kinesis at {where}: no AWS credentials found; {IAM_FIX}")
    response = getattr(exc, "response", None)
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode") if isinstance(
        response, dict) else None
    if error_code(exc) in _REFUSED or status == 403:
        text = shorten(" ".join(mask_secrets(str(exc)).split()), 300)
        return AccessRefused(f"Kinesis at {where} refused the relay: {text}; {IAM_FIX}")
    return None
