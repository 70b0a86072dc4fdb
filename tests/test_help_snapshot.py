"""Every command's ``--help``, byte for byte, as a user sees it in a terminal 100 columns wide (issue 56, item 3).

The fixtures in tests/fixtures/help/ were written from the CLI before it was reshaped, so that a change to how the
options are declared shows exactly what moved in the help. A deliberate change to the help rewrites them:
``TEXTGEN_UPDATE_SNAPSHOTS=1 pytest tests/test_help_snapshot.py``, and the diff goes in the same commit.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures" / "help"
COMMANDS = ["train", "distill", "prune", "sample", "repl", "serve", "evaluate", "export", "tune", "runs"]
ANSI = re.compile(r"\x1b\[[0-9;]*m")  # styles, should the environment force a terminal (FORCE_COLOR, CI)


def rendered_help(*command: str) -> str:
    """``textgen COMMAND --help`` in-process, 100 columns wide, without colour."""
    from typer.testing import CliRunner

    from textgen.cli import app

    env = {"COLUMNS": "100", "NO_COLOR": "1", "TERM": "dumb"}
    result = CliRunner().invoke(app, [*command, "--help"], env=env, prog_name="textgen")
    assert result.exit_code == 0, result.output
    return ANSI.sub("", result.stdout)


def test_the_snapshots_cover_every_command() -> None:
    from typer.main import get_command

    from textgen.cli import app

    assert sorted(get_command(app).commands) == sorted(COMMANDS)


@pytest.mark.parametrize("command", ["textgen", *COMMANDS])
def test_help_is_unchanged(command: str) -> None:
    text = rendered_help(*([] if command == "textgen" else [command]))
    fixture = FIXTURES / f"{command}.txt"
    if os.environ.get("TEXTGEN_UPDATE_SNAPSHOTS") == "1":
        fixture.parent.mkdir(parents=True, exist_ok=True)
        fixture.write_text(text, encoding="utf-8")
    assert text == fixture.read_text(encoding="utf-8"), f"textgen {command} --help changed; see this file's docstring"
