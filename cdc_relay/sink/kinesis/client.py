"""The boto3 Kinesis client of the kinesis sink and how its errors read (sink/kinesis/sink.py, probe.py).

Owns which errors are a refusal of the credentials or permissions (``AccessRefused``, exit
6, with the IAM fix), a record's ErrorCode among them; building the client (credentials and
region from boto3's standard chain) and reading an error's AWS code are sink/aws.py's.
Must not send anything.
"""

from __future__ import annotations

from typing import Any

from cdc_relay.errors import AccessRefused
from cdc_relay.sink.aws import aws_refusal, make_aws_client
from cdc_relay.sink.aws import error_code as error_code
from cdc_relay.sink.kinesis.config import KinesisConfig

MISSING = ("ResourceNotFoundException",)
_REFUSED = ("AccessDenied", "AccessDeniedException", "InvalidClientTokenId",
            "SignatureDoesNotMatch", "UnrecognizedClientException", "ExpiredTokenException",
            "ExpiredToken", "MissingAuthenticationToken", "InvalidAccessKeyId",
            "KMSAccessDeniedException", "IncompleteSignature")
IAM_FIX = ("grant kinesis:PutRecords and kinesis:DescribeStreamSummary on the streams (and "
           "kms:GenerateDataKey on a stream's customer key), and check the credentials boto3 "
           "finds (AWS_ACCESS_KEY_ID/AWS_PROFILE/the instance role)")
_NO_REGION = ("no AWS region for the kinesis sink: use --brokers kinesis://REGION, "
              "--sink-config region=REGION, or AWS_REGION")


def make_client(config: KinesisConfig) -> Any:
    """A boto3 Kinesis client for the config; credentials and region from boto3's standard chain."""
    return make_aws_client("kinesis", config, region=config.region, no_region=_NO_REGION,
                           max_attempts=1)


def refusal(exc: BaseException | str, where: str) -> AccessRefused | None:
    """AccessRefused when ``exc`` (or a record's ErrorCode) says the credentials or
    permissions were refused."""
    if isinstance(exc, str):
        return (AccessRefused(f"Kinesis at {where} refused a record: {exc}; {IAM_FIX}")
                if exc in _REFUSED else None)
    return aws_refusal(exc, f"Kinesis at {where}", _REFUSED, IAM_FIX)
