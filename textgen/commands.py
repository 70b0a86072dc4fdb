"""The commands textgen suggests (the quick start, a first run or study, how to go on), written the way the user
started textgen, so that each runs as printed: ``.venv/bin/textgen``, ``textgen`` or ``python -m textgen``.

The quick start lives here and nowhere else in code; the README's is checked against it
(tests/test_commands.py), so that the two change together. No TensorFlow.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path

from textgen.basemodel import BASE_NAME
from textgen.config import DEFAULT_CHECKPOINT_DIR

CORPUS = "2600-0.txt"  # War and Peace: --download fetches it from Project Gutenberg where it is absent
# A first run that works on a fresh clone: the corpus fetched if absent, and a budget (without one, 30 epochs take
# hours on a CPU).
QUICK_START_TRAIN = f"train {CORPUS} --device cpu --download --time-budget 12m"
# With no run trained, sample uses the base model the package ships: the first command after the install.
QUICK_START_SAMPLE = "sample --temp 0.8"
# The user's own text, from the base: 2 minutes is the budget docs/finetuning.md measures at 50 kB.
FINE_TUNE = f"train FILE --init-from {BASE_NAME} --time-budget 2m"
MY_TEXT = "my-text.txt"  # the README's stand-in for the user's own text
# A first study: tune's own default budget is 2 hours.
FIRST_STUDY = f"tune {CORPUS} --download --time-budget 1h --trial-budget 10m"


def program() -> str:
    """textgen as the user started it: ``textgen`` when PATH finds this very script, else the script's path from
    the working directory (``.venv/bin/textgen``); ``python -m textgen`` alike; ``textgen`` when textgen is not
    the program (a Python caller of the library, a test runner)."""
    script = Path(sys.argv[0]) if sys.argv and sys.argv[0] else Path()
    if script.name == "__main__.py" and script.parent.name == "textgen":
        return f"{_as_typed(sys.executable, 'python', 'python3')} -m textgen"
    if script.stem == "textgen":
        return _as_typed(str(script), "textgen")
    return "textgen"


def _as_typed(path: str, *names: str) -> str:
    """How to type the program ``path``: one of ``names`` if PATH finds this very file under it, else its path
    relative to the working directory, or absolute when it lies outside it. Links are not followed: a venv's
    python is a link to one that does not see the venv's packages."""
    full = os.path.abspath(path)
    for name in names:
        found = shutil.which(name)
        if found and os.path.abspath(found) == full:
            return name
    relative = os.path.relpath(full)
    if relative.startswith(os.pardir):
        return shlex.quote(full)
    return shlex.quote(relative if os.sep in relative else os.path.join(os.curdir, relative))


def command(args: str) -> str:
    """A textgen command with these arguments, as the user runs textgen."""
    return f"{program()} {args}"


def checkpoint_dir_flag(checkpoint_dir: Path) -> str:
    """`` --checkpoint-dir DIR`` for a command shown to the user, unless ``DIR`` is the default."""
    return "" if Path(checkpoint_dir) == DEFAULT_CHECKPOINT_DIR else f" --checkpoint-dir {checkpoint_dir}"


def fine_tune(file: str = "FILE", checkpoint_dir: Path = DEFAULT_CHECKPOINT_DIR) -> str:
    """The command that fine-tunes the base model on ``file`` (a placeholder unless given) into ``checkpoint_dir``."""
    return command(FINE_TUNE.replace("FILE", file, 1)) + checkpoint_dir_flag(checkpoint_dir)


def quick_start() -> tuple[str, str, str]:
    """The quick start's three paths, as the README and the help give them, each ending in a sample: the base
    model at once; the user's text, from the base; a model of War and Peace from scratch."""
    sample = command(QUICK_START_SAMPLE)
    return sample, f"{fine_tune(MY_TEXT)} && {sample}", f"{command(QUICK_START_TRAIN)} && {sample}"
