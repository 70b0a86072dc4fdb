"""The one module that reaches into Typer's private parts, so that a Typer release that moves them breaks here.

Typer 0.29 vendors click as ``typer._click`` and exports neither click's ``NoSuchOption`` (which ``cliapp`` words
as "it is an option of textgen X" or "did you mean") nor the ``Command`` and ``Context`` types its group and command
classes are typed with. And its option class has no setting for two things textgen's help shows its own way: a
flag without a value type (``--json``, not ``--json <bool>``), and a default written as text as it is written
(``[default: the latest run]``, not ``[default: (the latest run)]``); ``HelpOption`` is that class with those two
methods overridden, and ``cliapp``'s commands give it to their own options, leaving Typer's class as it is.
pyproject.toml pins typer to 0.29 for this module.
"""

from __future__ import annotations

from typing import Any

from typer._click import Command, Context
from typer._click.exceptions import NoSuchOption
from typer.core import TyperOption

__all__ = ["Command", "Context", "HelpOption", "NoSuchOption", "help_options"]


class HelpOption(TyperOption):
    """Typer's option, shown in ``--help`` without a value type for a flag, and with a default written as text
    as it is written."""

    def display_type_rich(self, ctx: Context) -> str | None:
        return None if self.is_flag else super().display_type_rich(ctx)

    def _get_default_string(self, *, ctx: Context, show_default_is_str: bool, default_value: Any) -> str:
        if show_default_is_str:
            return str(self.show_default)
        return super()._get_default_string(ctx=ctx, show_default_is_str=False, default_value=default_value)


def help_options(params: list[Any]) -> list[Any]:
    """``params`` with each of Typer's options made a ``HelpOption``: the same object, shown the textgen way.
    (Typer builds its options itself, with no class to ask for, so a command retypes its own.)"""
    for param in params:
        if type(param) is TyperOption:
            param.__class__ = HelpOption
    return params
