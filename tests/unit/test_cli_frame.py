"""The CLI frame: flag > env > config file precedence, one-line errors, exit codes."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdc_relay.cli.main import cli
from cdc_relay.cli.options import run_cli
from cdc_relay.errors import ExitCode

CLOSED = "host=127.0.0.1 port=1 dbname=x user=u password=hunter2 connect_timeout=2"


def invoke(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = run_cli(cli, args)
    captured = capsys.readouterr()
    return code, captured.err


def test_flag_beats_env_beats_config_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Each source gives an invalid table name of its own; the error names the winner,
    # and the check happens before any connection is attempted.
    config = tmp_path / "relay.toml"
    config.write_text('table = "from_file;x"\n')
    monkeypatch.setenv("CDC_RELAY_TABLE", "from_env;x")
    base = ["--config", str(config), "init", "--dsn", CLOSED]

    code, err = invoke([*base, "--table", "from_flag;x"], capsys)
    assert code == ExitCode.USAGE and "from_flag;x" in err

    code, err = invoke(base, capsys)
    assert code == ExitCode.USAGE and "from_env;x" in err

    monkeypatch.delenv("CDC_RELAY_TABLE")
    code, err = invoke(base, capsys)
    assert code == ExitCode.USAGE and "from_file;x" in err


def test_command_section_of_the_config_file_applies_to_that_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "relay.toml"
    config.write_text('[init]\nslot = "Bad-Slot"\n')
    code, err = invoke(["--config", str(config), "init", "--dsn", CLOSED], capsys)
    assert code == ExitCode.USAGE
    assert "Bad-Slot" in err


@pytest.mark.parametrize(
    "content, fragment",
    [
        ('nonsense = 1\n', "unknown key 'nonsense'"),
        ('[run]\nslot_name = "x"\n', "unknown key 'slot_name' in section [run]"),
        ('[runn]\nslot = "x"\n', "unknown section [runn]"),
        ('table = \n', "not valid TOML"),
    ],
)
def test_bad_config_file_is_a_one_line_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, fragment: str
) -> None:
    config = tmp_path / "relay.toml"
    config.write_text(content)
    code, err = invoke(["--config", str(config), "init", "--dsn", CLOSED], capsys)
    assert code == ExitCode.USAGE
    assert fragment in err
    assert len(err.strip().splitlines()) == 1
    assert "Traceback" not in err


def test_malformed_duration_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = invoke(["run", "--dsn", CLOSED, "--brokers", "127.0.0.1:1",
                        "--status-interval", "soon"], capsys)
    assert code == ExitCode.USAGE
    assert "soon" in err and len(err.strip().splitlines()) == 1


def test_missing_dsn_names_the_flag_and_the_environment_variable(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CDC_RELAY_DSN", raising=False)
    code, err = invoke(["init"], capsys)
    assert code == ExitCode.USAGE
    assert "--dsn" in err and "CDC_RELAY_DSN" in err


def test_unknown_option_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = invoke(["init", "--dsn", CLOSED, "--frobnicate"], capsys)
    assert code == ExitCode.USAGE
    assert "--frobnicate" in err and "Traceback" not in err


def test_unreachable_database_is_one_line_without_the_password(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, err = invoke(["init", "--dsn", CLOSED], capsys)
    assert code == ExitCode.UNAVAILABLE
    assert "hunter2" not in err
    assert len(err.strip().splitlines()) == 1


def test_producer_config_from_a_toml_table(tmp_path: Path) -> None:
    from cdc_relay.cli.options import load_config_file

    config = tmp_path / "relay.toml"
    config.write_text('brokers = "b:9092"\n[run.producer_config]\n"compression.type" = "lz4"\n')
    default_map = load_config_file(str(config), cli)
    assert default_map["run"]["producer_config"] == ("compression.type=lz4",)
    assert default_map["run"]["brokers"] == "b:9092"
    assert "brokers" not in default_map["init"]


def test_ctrl_c_in_a_command_exits_130_and_a_declined_prompt_exits_1(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import click

    @click.group()
    def group() -> None:
        pass

    @group.command()
    def interrupted() -> None:
        raise KeyboardInterrupt

    @group.command()
    def declined() -> None:
        raise click.Abort

    assert run_cli(group, ["interrupted"]) == ExitCode.INTERRUPTED
    assert "interrupted" in capsys.readouterr().err
    assert run_cli(group, ["declined"]) == ExitCode.FAILURE
    assert "aborted" in capsys.readouterr().err


def test_a_capture_section_sets_table_cdcs_options_of_every_command_that_has_them(
        tmp_path: Path) -> None:
    from cdc_relay.cli.config_file import load_config_file

    config = tmp_path / "relay.toml"
    config.write_text('[capture]\ntables = "public.customers,sales.*"\nprefix = "shop"\n'
                      'no-outbox = true\ndecimal_handling = "string"\nsnapshot_chunk_size = 10\n'
                      '[run]\ncapture_prefix = "own"\n')
    defaults = load_config_file(str(config), cli)
    run = defaults["run"]
    assert run["capture"] == "public.customers,sales.*" and run["no_outbox"] is True
    assert run["capture_prefix"] == "own"  # the command's own section wins
    assert run["capture_decimal_handling"] == "string" and run["snapshot_chunk_size"] == 10
    assert defaults["init"]["capture"] == "public.customers,sales.*"
    assert defaults["doctor"]["capture"] == "public.customers,sales.*"
    assert "capture" not in defaults["poll"]


def test_an_unknown_capture_key_is_a_one_line_usage_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "relay.toml"
    config.write_text('[capture]\ndsn = "x"\n')
    code, err = invoke(["--config", str(config), "init", "--dsn", CLOSED], capsys)
    assert code == ExitCode.USAGE and "unknown key 'dsn' in section [capture]" in err
