"""Rotating credentials without a database: the providers, the IAM token's plumbing, the CLI.

``--aws-rds-iam`` is tested with a fake token function (no AWS here): what the relay asks
boto3 for and what it does with the answer, never RDS itself.
"""

from __future__ import annotations

import socket
import sys

import pytest

from cdc_relay.app.credentials import build_provider, credentials_for
from cdc_relay.config import CredentialsConfig
from cdc_relay.errors import AccessRefused, ConfigError, ExitCode, ServiceUnavailable
from cdc_relay.pg import db
from cdc_relay.pg.credentials import CommandPassword, RdsIamToken, Target
from tests.support import run_cli_in_process

TARGET = Target(host="db.example", port=5433, user="relay")


def test_the_password_is_the_first_line_the_command_prints() -> None:
    assert CommandPassword("printf 'hunter2\\nsecond line\\n'")(TARGET) == "hunter2"


@pytest.mark.parametrize("command", ["exit 4", "true", "echo", "printf ''"])
def test_a_command_that_fails_or_prints_no_password_is_refused(command: str) -> None:
    with pytest.raises(AccessRefused) as info:
        CommandPassword(command)(TARGET)
    assert info.value.exit_code == ExitCode.REFUSED
    assert "\n" not in str(info.value) and "--password-command" in str(info.value)


def test_a_failing_command_says_its_stderr_never_its_stdout() -> None:
    with pytest.raises(AccessRefused) as info:
        CommandPassword("echo leaked-secret; echo vault sealed >&2; exit 2")(TARGET)
    assert "vault sealed" in str(info.value) and "leaked-secret" not in str(info.value)


def test_a_command_that_hangs_is_refused_after_its_timeout() -> None:
    with pytest.raises(AccessRefused, match="did not finish"):
        CommandPassword("sleep 5", timeout=0.2)(TARGET)


class FakeTokens:
    """A stand-in for boto3's generate_db_auth_token: records what it was asked for."""

    def __init__(self, fail: Exception | None = None) -> None:
        self.calls: list[tuple[str, int, str, str]] = []
        self._fail = fail

    def __call__(self, host: str, port: int, user: str, region: str) -> str:
        if self._fail is not None:
            raise self._fail
        self.calls.append((host, port, user, region))
        return f"token-{len(self.calls)}"


def test_an_iam_token_is_made_per_connection_for_its_host_port_user_and_region() -> None:
    tokens = FakeTokens()
    provider = RdsIamToken(tokens, "eu-west-1")
    assert [provider(TARGET), provider(TARGET)] == ["token-1", "token-2"]
    assert tokens.calls == [("db.example", 5433, "relay", "eu-west-1")] * 2


def test_a_token_that_cannot_be_made_is_refused_with_the_iam_fix() -> None:
    provider = RdsIamToken(FakeTokens(fail=RuntimeError("Unable to locate credentials")), "eu-west-1")
    with pytest.raises(AccessRefused, match="rds-db:connect"):
        provider(TARGET)


@pytest.mark.parametrize("sslmode", ["disable", "allow", "prefer", None])
def test_iam_tokens_need_sslmode_require_or_stronger(sslmode: str | None,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PGSSLMODE", raising=False)
    dsn = "host=db.example user=relay" + (f" sslmode={sslmode}" if sslmode else "")
    config = CredentialsConfig(aws_rds_iam=True, aws_region="eu-west-1")
    with pytest.raises(ConfigError, match="sslmode") as info:
        build_provider(config, dsn, token_function=FakeTokens())
    assert info.value.exit_code == ExitCode.USAGE


@pytest.mark.parametrize("sslmode", ["require", "verify-ca", "verify-full"])
def test_iam_tokens_are_accepted_over_an_encrypted_dsn(sslmode: str) -> None:
    config = CredentialsConfig(aws_rds_iam=True, aws_region="eu-west-1")
    provider = build_provider(config, f"host=db.example user=relay sslmode={sslmode}",
                              token_function=FakeTokens())
    assert isinstance(provider, RdsIamToken)


def test_without_boto3_iam_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "boto3", None)  # import boto3 -> ImportError
    config = CredentialsConfig(aws_rds_iam=True, aws_region="eu-west-1")
    with pytest.raises(ConfigError, match=r"pip install 'cdc-relay\[sqs\]'"):
        build_provider(config, "host=db.example user=relay sslmode=require")


def test_boto3s_token_function_is_called_with_the_connections_target(
        monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("boto3")
    # boto3 signs locally (no request is sent): made-up keys are enough to see the token.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-a-secret")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    config = CredentialsConfig(aws_rds_iam=True, aws_region="eu-west-1")
    provider = build_provider(config, "host=db.example user=relay sslmode=require")
    assert provider is not None
    token = provider(TARGET)
    assert token.startswith("db.example:5433/?Action=connect") and "DBUser=relay" in token


@pytest.mark.parametrize("config", [
    {"password_command": "cat /run/pw", "aws_rds_iam": True},
    {"password_command": "  "},
    {"aws_region": "eu-west-1"},
])
def test_contradictory_credentials_options_are_refused(config: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        CredentialsConfig(**config)  # type: ignore[arg-type]


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_every_connection_asks_the_installed_provider_for_its_target() -> None:
    asked: list[Target] = []

    def provider(target: Target) -> str:
        asked.append(target)
        return "from-the-provider"

    port = _closed_port()
    with db.password_provider(provider):
        for _ in range(2):
            with pytest.raises(ServiceUnavailable):
                db.connect(f"host=127.0.0.1 port={port} user=relay dbname=app connect_timeout=2")
    with pytest.raises(ServiceUnavailable):  # uninstalled: asked no more
        db.connect(f"host=127.0.0.1 port={port} user=relay dbname=app connect_timeout=2")
    assert asked == [Target("127.0.0.1", port, "relay")] * 2


def test_a_provider_that_refuses_stops_the_connection_before_it_is_tried() -> None:
    with (credentials_for(CredentialsConfig(password_command="exit 1"), "host=x"),
          pytest.raises(AccessRefused)):
        db.connect("host=127.0.0.1 port=1 user=relay")


def test_the_cli_refuses_iam_over_an_unencrypted_dsn_in_one_line(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PGSSLMODE", raising=False)
    result = run_cli_in_process("status", "--dsn", "host=127.0.0.1 port=1 user=relay",
                                "--aws-rds-iam", "--aws-region", "eu-west-1")
    assert result.returncode == ExitCode.USAGE
    assert len(result.stderr.strip().splitlines()) == 1 and "sslmode" in result.stderr


def test_the_cli_password_command_failing_is_exit_6_in_one_line() -> None:
    result = run_cli_in_process("status", "--dsn", "host=127.0.0.1 port=1 user=relay",
                                "--password-command", "exit 9")
    assert result.returncode == ExitCode.REFUSED
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
