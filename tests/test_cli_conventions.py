"""The conventions every ``textgen`` command keeps (issue 41): how ``--help`` shows flags, defaults and examples,
what a flag given a value or an unknown option says, and the names of the runs a command reads and makes."""

from __future__ import annotations

import pytest

COMMANDS = ["train", "distill", "prune", "sample", "repl", "evaluate", "export", "tune", "runs"]


def help_text(*command: str, columns: int = 80) -> str:
    from typer.testing import CliRunner

    from textgen.cli import app

    result = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": str(columns)})
    assert result.exit_code == 0, result.output
    return result.stdout


@pytest.mark.parametrize("command", [[], *([c] for c in COMMANDS)])
def test_help_shows_no_type_after_a_flag_and_defaults_one_way(command: list[str]) -> None:
    text = help_text(*command)
    assert "<bool>" not in text  # a flag takes no value
    assert "[default: (" not in text


def test_a_default_written_as_text_reads_as_written() -> None:
    text = help_text("train", columns=200)
    assert "[default: the device profile's]" in text and "[default: 0.1]" in text and "[default: on]" in text
