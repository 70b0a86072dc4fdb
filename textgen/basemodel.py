"""The base model in the package: an LSTM trained on public-domain English prose, shipped as a float16 LiteRT
export (docs/base-model.md), named ``BASE_NAME`` wherever a run or an export is taken. No TensorFlow here.

Its name holds a ':', which no run's name may (``checkpoint.check_run_name``), so it never hides a run, and a run
never hides it.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from textgen.errors import ConfigError

BASE_NAME = "base:en"

# The characters the base model's vocabulary starts with, in id order, whatever its books hold: what users' English
# text holds, so that a prompt or a text to fine-tune on rarely has a character the model has never had an id for.
# Printable ASCII with newline and tab, Latin-1's letters and signs (no-break space included), and the common
# typographic characters: curly quotes, dashes, ellipsis, bullet, primes.
TYPOGRAPHY = "\u2018\u2019\u201a\u201c\u201d\u201e\u2013\u2014\u2026\u2022\u2032\u2033"
BASE_CHARS = "\t\n" + "".join(map(chr, range(0x20, 0x7F))) + "".join(map(chr, range(0xA0, 0x100))) + TYPOGRAPHY


def base_dir() -> Path:
    """Where the package holds the base model's export (it may be missing from a source checkout)."""
    return Path(str(resources.files("textgen") / "base" / "en"))


def names_base(source: str | Path | None) -> bool:
    """Whether ``source``, a run's name or a model's path as given, is the base model's name."""
    return source is not None and str(source) == BASE_NAME


def is_base_dir(path: Path) -> bool:
    """Whether ``path`` is the packaged base model's directory (or a file in it)."""
    here = base_dir().resolve()
    path = Path(path).resolve()
    return path == here or path.parent == here


def has_base() -> bool:
    """Whether this installation holds the base model (an install from PyPI does; a checkout may not)."""
    return (base_dir() / "textgen.json").is_file()


def restore() -> str:
    """What brings the package's copy back: in a clone (an editable install), git has it; else the install."""
    clone = base_dir().parents[2]
    if (clone / ".git").exists():
        return f"restore it: git -C {clone} checkout -- textgen/base/en"
    return "reinstall textgen as you installed it (pip install --force-reinstall ...)"


def base_path() -> Path:
    """The base model's directory, or one clear error when this installation lacks it."""
    if not has_base():
        raise ConfigError(
            f"{BASE_NAME}: this installation of textgen has no base model ({base_dir()} is missing); "
            f"{restore()}, or build it: python benchmarks/basemodel.py"
        )
    return base_dir()


def damaged(exc: ConfigError, advice: str) -> ConfigError:
    """``exc``, an export's check failing on the base model's files, with what to do about a damaged install
    instead of ``advice`` (to export the run again)."""
    problem = str(exc).removesuffix(f"; {advice}")
    return ConfigError(f"the packaged base model {BASE_NAME} is damaged: {problem}; {restore()}")
