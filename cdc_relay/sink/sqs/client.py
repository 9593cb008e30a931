"""The boto3 SQS client of the sqs sink and how its errors read (sink/sqs/sink.py, probe.py).

Owns building the client from ``SqsConfig`` (credentials from boto3's standard chain; the
region from the AWS SDKs' chain, ``region_chain``), an error's AWS code, the command that
creates a missing queue, and which errors are a refusal of the credentials or permissions
(``AccessRefused``, exit 6, with the IAM fix). Must not send anything.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
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


NO_REGION = ("no AWS region for the sqs sink: use --brokers sqs://REGION, --sink-config "
             "region=REGION, AWS_REGION, AWS_DEFAULT_REGION or a profile's region")


def region_chain(config: SqsConfig, environ: Mapping[str, str]) -> str | None:
    """The region to hand boto3, in the order the AWS SDKs and CLI v2 use: ``sqs://REGION``
    or ``--sink-config region=``, then ``AWS_REGION``; None leaves the rest of the chain to
    boto3 (``AWS_DEFAULT_REGION``, then the profile's ``region``).

    boto3 alone skips ``AWS_REGION``, which the other SDKs, the CLI v2, Lambda and ECS use.
    """
    return config.region or environ.get("AWS_REGION") or None


def create_queue_command(name: str) -> str:
    """The AWS CLI command that creates queue ``name`` as the relay expects it (FIFO by its suffix)."""
    return (f"aws sqs create-queue --queue-name {name}"
            + (" --attributes FifoQueue=true" if name.endswith(".fifo") else ""))


def make_client(config: SqsConfig) -> Any:
    """A boto3 SQS client for the config; credentials from boto3's standard chain, the region
    from ``region_chain``."""
    try:
        session = boto3.session.Session(profile_name=config.profile,
                                        region_name=region_chain(config, os.environ))
    except botocore.exceptions.ProfileNotFound as exc:
        raise ConfigError(f"--sink-config profile={config.profile}: {exc}") from exc
    if session.region_name is None:
        raise ConfigError(NO_REGION)
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
