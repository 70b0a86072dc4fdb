"""The conventions every ``textgen`` command keeps (issue 41): how ``--help`` shows flags, defaults and examples,
what a flag given a value or an unknown option says, and the names of the runs a command reads and makes."""

from __future__ import annotations

import re

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


@pytest.mark.parametrize("command", COMMANDS)
def test_help_holds_no_measurements(command: str) -> None:
    """Measured numbers belong in docs/, which the help points to."""
    measured = re.compile(r"\d\s*(nats/char|bits/char|chars/s)|\d\.\d+x\b")
    assert not measured.search(help_text(command, columns=200))


@pytest.mark.parametrize("command", COMMANDS)
def test_examples_are_single_spaced_and_unwrapped_at_80_columns(command: str) -> None:
    from typer.main import get_command

    from textgen.cli import app

    examples = [line.strip() for line in get_command(app).commands[command].epilog.splitlines() if line[:4] == "    "]
    lines = [line.strip() for line in help_text(command).splitlines()]
    first = lines.index(examples[0])
    assert lines[first : first + len(examples)] == examples
