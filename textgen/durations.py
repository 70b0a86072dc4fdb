"""Durations as the CLI takes and shows them: ``90s``, ``30m``, ``1h30m``, and ``+30m`` for more of a run's time."""

from __future__ import annotations

import re

from textgen.errors import ConfigError

_DURATION = re.compile(r"^(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s?)?$")


def parse_duration(text: str, flag_name: str = "--time-budget", zero: bool = False) -> float:
    """Seconds in ``90``, ``90s``, ``30m``, ``1h``, ``1h30m``, ``2.5h`` (and ``0`` if ``zero`` is allowed)."""
    match = _DURATION.match(text.strip().lower())
    if not text.strip() or not match or not any(match.groups()):
        raise ConfigError(f"{flag_name} must be a duration like 90s, 30m or 1h30m (got {text!r})")
    hours, minutes, seconds = (float(g) if g else 0.0 for g in match.groups())
    total = hours * 3600 + minutes * 60 + seconds
    if total < 0 or (total == 0 and not zero):
        raise ConfigError(f"{flag_name} must be {'0 or more' if zero else 'positive'} (got {text!r})")
    return total


def parse_budget(text: str | None) -> tuple[float | None, float | None]:
    """``--time-budget`` as ``TrainSettings``' (``time_budget``, ``more_time``): ``30m``, a run's whole budget, or
    ``+30m``, that much more than the run has trained."""
    if not text:
        return None, None
    rest = text.strip().removeprefix("+")
    seconds = parse_duration(text if rest.startswith("+") else rest)
    return (None, seconds) if text.strip().startswith("+") else (seconds, None)


def format_seconds(seconds: float) -> str:
    """``3h02m``, ``4m05s`` or ``12.3s``: a duration ``parse_duration`` reads back."""
    if seconds >= 3600:
        return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"
    if seconds >= 60:
        return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"
    return f"{seconds:.1f}s"


MORE_TIME = "+30m"  # the --time-budget suggested for training a run further
