"""The boto3 SQS client of the sqs sink and how its errors read (sink/sqs/sink.py, probe.py).

Owns building the client from ``SqsConfig`` (credentials and region from boto3's
standard chain), an error's AWS code, and which errors are a refusal of the credentials
or permissions (``AccessRefused``, exit 6, with the IAM fix). Must not send anything.
"""

from __future__ import annotations

from typing import Any

import boto3
import botocore.config
import botocore.exceptions

from cdc_relay.errors import AccessRefused, ConfigError, mask_secrets
from cdc_relay.sink.sqs.config import SqsConfig
from cdc_relay.text import shorten

MISSING = ("AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist")
_REFUSED = ("AccessDenied", "AccessDeniedException", "InvalidClientTokenId",
            "SignatureDoesNotMatch", "UnrecognizedClientException", "InvalidSecurity",
            "ExpiredToken", "MissingAuthenticationToken", "InvalidAccessKeyId",
            "KMS.AccessDeniedException", "RequestExpired")
IAM_FIX = ("grant sqs:SendMessage, sqs:GetQueueUrl and sqs:GetQueueAttributes on the queues, and "
            "check the credentials boto3 finds (AWS_ACCESS_KEY_ID/AWS_PROFILE/the instance role)")


def make_client(config: SqsConfig) -> Any:
    """A boto3 SQS client for the config; credentials and region from boto3's standard chain."""
    try:
        session = boto3.session.Session(profile_name=config.profile, region_name=config.region)
    except botocore.exceptions.ProfileNotFound as exc:
        raise ConfigError(f"--sink-config profile={config.profile}: {exc}") from exc
    if session.region_name is None:
        raise ConfigError("no AWS region for the sqs sink: use --brokers sqs://REGION, "
                          "--sink-config region=REGION, or AWS_REGION")
    settings = botocore.config.Config(
        connect_timeout=config.connect_timeout, read_timeout=config.read_timeout,
        retries={"max_attempts": 2, "mode": "standard"},
        max_pool_connections=config.concurrency + 2)
    return session.client("sqs", endpoint_url=config.endpoint_url, config=settings)


def error_code(exc: BaseException) -> str:
    """The AWS error code of a ClientError ('' for anything else)."""
    if isinstance(exc, botocore.exceptions.ClientError):
        return str(exc.response.get("Error", {}).get("Code", ""))
    return ""


def refusal(exc: BaseException, where: str) -> AccessRefused | None:
    """AccessRefused when ``exc`` says the credentials or permissions were refused."""
    if isinstance(exc, botocore.exceptions.NoCredentialsError):
        return AccessRefused(f"SQS at {where}: no AWS credentials found; {IAM_FIX}")
    response = getattr(exc, "response", None)  # None on some botocore errors (timeouts)
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode") if isinstance(
        response, dict) else None
    if error_code(exc) in _REFUSED or status == 403:  # 403: a refusal whose body was unparsed
        text = shorten(" ".join(mask_secrets(str(exc)).split()), 300)
        return AccessRefused(f"SQS at {where} refused the relay: {text}; {IAM_FIX}")
    return None
