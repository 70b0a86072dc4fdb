"""The conventions every ``textgen`` command keeps (issue 41): how ``--help`` shows flags, defaults and examples,
what a flag given a value or an unknown option says, and the names of the runs a command reads and makes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers import assert_one_line_error, run_python

COMMANDS = ["train", "distill", "prune", "sample", "repl", "evaluate", "export", "tune", "runs"]


def flags() -> list[tuple[str, str]]:
    """Every (command, flag) pair: the options that take no value."""
    from typer.main import get_command

    from textgen.cli import app

    return [
        (name, flag)
        for name, command in get_command(app).commands.items()
        for option in command.params
        if getattr(option, "is_flag", False) and not option.hidden
        for flag in (*option.opts, *option.secondary_opts)
    ]


def invoke(*args: str, columns: int = 80):
    """The CLI run in-process, as ``textgen`` in a terminal this wide."""
    from typer.testing import CliRunner

    from textgen.cli import app

    return CliRunner().invoke(app, list(args), env={"COLUMNS": str(columns)}, prog_name="textgen")


def help_text(*command: str, columns: int = 80) -> str:
    result = invoke(*command, "--help", columns=columns)
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


@pytest.mark.parametrize(("command", "flag"), flags())
def test_a_flag_given_a_value_is_one_line_saying_how_to_write_it(command: str, flag: str) -> None:
    for word in ("true", "No", "1"):
        result = invoke(command, flag, word)
        line = assert_one_line_error(result, f"error: {flag} is a flag and takes no value: ")
        assert result.exit_code == 2 and line.endswith(f"; see textgen {command} --help")


@pytest.mark.parametrize(
    ("args", "instead"),
    [
        (["runs", "--json", "true"], "--json is a flag and takes no value: write textgen runs --json"),
        (["runs", "--json", "false"], "--json is a flag and takes no value: leave it out for off"),
        (
            ["train", "x.txt", "--layer-norm", "no"],
            "--layer-norm is a flag and takes no value: write textgen train --no-layer-norm",
        ),
        (
            ["train", "x.txt", "--no-shift-windows", "yes"],
            "--no-shift-windows is a flag and takes no value: write textgen train --no-shift-windows",
        ),
        (["tune", "--show", "on", "--json"], "--show is a flag and takes no value: write textgen tune --show"),
    ],
)
def test_a_flag_given_a_value_says_what_to_write_instead(args: list[str], instead: str) -> None:
    assert assert_one_line_error(invoke(*args)) == f"error: {instead}; see textgen {args[0]} --help"


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["train", "x.txt", "--temp", "0.8"],
            "no such option --temp for train (it is an option of textgen sample and textgen repl); "
            "see textgen train --help",
        ),
        (["sample", "--tmp", "1"], "no such option --tmp for sample (did you mean --temp?); see textgen sample --help"),
        (["train", "--seq", "8"], "no such option --seq for train (did you mean --seq-len?); see textgen train --help"),
        (["sample", "--bogus"], "no such option --bogus for sample; see textgen sample --help"),
        (
            ["--temp", "1"],
            "no such option --temp (it is an option of textgen sample and textgen repl); see textgen --help",
        ),
    ],
)
def test_an_unknown_option_is_told_where_it_belongs_or_what_is_near(args: list[str], line: str) -> None:
    result = invoke(*args)
    assert assert_one_line_error(result) == f"error: {line}"
    assert result.exit_code == 2


def test_shell_completion_completes_commands_options_and_choices_without_tensorflow(tmp_path: Path) -> None:
    assert "--install-completion" in help_text() and "--show-completion" in help_text()
    code = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from textgen.cli import app\n"
        # The script --show-completion prints in bash. (--show-completion finds the shell among the parent processes,
        # which a suite started by a script may not have: asked for by name, it does not depend on them.)
        "shown = CliRunner().invoke(app, [], prog_name='textgen', env={'_TEXTGEN_COMPLETE': 'source_bash'})\n"
        "assert shown.exit_code == 0 and '_TEXTGEN_COMPLETE=complete_bash' in shown.stdout, shown.output\n"
        "for words, expected in (('textgen tr', ['train']), ('textgen train --lay', ['--layers', '--layer-norm']),\n"
        "                        ('textgen train --device ', ['auto', 'cpu', 'gpu'])):\n"
        "    env = {'_TEXTGEN_COMPLETE': 'complete_bash', 'COMP_WORDS': words, 'COMP_CWORD': str(len(words.split(' ')) - 1)}\n"
        "    done = CliRunner().invoke(app, [], prog_name='textgen', env=env)\n"
        "    assert done.stdout.split() == expected, (words, done.output)\n"
        "assert 'tensorflow' not in sys.modules, 'completion imported TensorFlow'\n"
    )
    proc = run_python(["-c", code], tmp_path)
    assert proc.returncode == 0, proc.stderr


def test_typer_is_used_as_it_is_and_its_private_click_reached_in_one_module() -> None:
    """No Typer class is patched (issue 56): another Typer app in the process sees Typer's own help."""
    from typer.core import TyperGroup, TyperOption

    import textgen.cli  # noqa: F401

    for cls, name in ((TyperOption, "display_type_rich"), (TyperOption, "_get_default_string"), (TyperGroup, "main")):
        assert getattr(cls, name).__module__ == "typer.core", f"{cls.__name__}.{name} is patched"
    package = Path(__file__).parent.parent / "textgen"
    private = sorted(p.name for p in package.rglob("*.py") if "typer._click" in p.read_text(encoding="utf-8"))
    assert private == ["clickcompat.py"]
