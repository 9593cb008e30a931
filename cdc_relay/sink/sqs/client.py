"""The boto3 SQS client of the sqs sink and how its errors read (sink/sqs/sink.py, probe.py).

Owns the client's region (the AWS SDKs' chain, ``region_chain``), the command that
creates a missing queue, and which errors are a refusal of the credentials or permissions
(``AccessRefused``, exit 6, with the IAM fix); building the client and reading an error's
AWS code are sink/aws.py's. Must not send anything.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from cdc_relay.errors import AccessRefused
from cdc_relay.sink.aws import aws_refusal, make_aws_client
from cdc_relay.sink.aws import error_code as error_code
from cdc_relay.sink.sqs.config import SqsConfig

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
    return make_aws_client("sqs", config, region=region_chain(config, os.environ),
                           no_region=NO_REGION, max_attempts=2)


def refusal(exc: BaseException, where: str) -> AccessRefused | None:
    """AccessRefused when ``exc`` says the credentials or permissions were refused."""
    return aws_refusal(exc, f"SQS at {where}", _REFUSED, IAM_FIX)
