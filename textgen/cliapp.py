"""How ``textgen`` behaves as a command line, apart from what each command does: its consoles, its group and
command classes (given to Typer with ``cls=``), and the one-line errors.

A usage error (a bad choice, a missing value) is one line, like textgen's own errors, instead of click's usage
block and Typer's error panel; an unknown option is told which commands have it, or the nearest option of its own;
a flag given a value (``--json true``) is told how to write it; and each command's options show in ``--help`` the
textgen way (``clickcompat.HelpOption``). No Typer class is changed: the classes here are Typer's, subclassed.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import itertools
import os
import sys
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import typer
from rich.console import Console
from typer.core import TyperCommand, TyperGroup, TyperOption

from textgen import ui
from textgen.clickcompat import Command, Context, NoSuchOption, help_options
from textgen.errors import ClusterError, TextgenError, TextgenWarning

console = Console(highlight=False, soft_wrap=True, emoji=False)  # user text is data: ":fire:" stays ":fire:"
err_console = Console(stderr=True, highlight=False, soft_wrap=True, emoji=False)

# What people write after a flag that takes no value (`--json true`), and the setting they mean.
FLAG_WORDS = {"true": True, "yes": True, "on": True, "1": True, "false": False, "no": False, "off": False, "0": False}


class TextgenCommand(TyperCommand):
    """A textgen command: Typer's, with its options shown in ``--help`` the textgen way."""

    def get_params(self, ctx: Context) -> list[Any]:
        return help_options(super().get_params(ctx))


class TextgenGroup(TyperGroup):
    """Typer's command group, with click's usage errors (a bad choice, a missing value) on one line
    like textgen's own, instead of a usage block and an error panel; an unknown option is told where it belongs,
    and a flag given a value how to write it."""

    def get_params(self, ctx: Context) -> list[Any]:  # --version, and Typer's completion options added after
        return help_options(super().get_params(ctx))

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **extra: Any,
    ) -> Any:
        call = {"args": args, "prog_name": prog_name, "complete_var": complete_var, **extra}
        if not standalone_mode:
            return super().main(**call, standalone_mode=False, windows_expand_args=windows_expand_args)
        try:
            code = super().main(**call, standalone_mode=False, windows_expand_args=windows_expand_args)  # Exit's code
        except typer.TyperException as exc:  # click's usage errors (click is typer 0.29's, vendored privately)
            message = getattr(exc, "format_message", exc.__str__)()
            if isinstance(exc, NoSuchOption) and exc.ctx is not None:
                message = self.no_such_option(exc.option_name, exc.ctx)
            if message.strip():  # no arguments: the message is the help, which Typer's rich help has printed
                ui.show_usage_error(err_console, message, getattr(exc, "ctx", None))
            sys.exit(exc.exit_code)
        except OSError as exc:  # outside the commands, which catch their own: --install-completion writing to $HOME
            ui.show_os_error(err_console, exc)
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)

    def resolve_command(self, ctx: Context, args: list[str]) -> tuple[str | None, Command | None, list[str]]:
        """The command to run, refusing a value after one of its flags (`--json true`), which click would take
        as an argument of its own (a corpus named "true") or refuse as an extra one."""
        name, command, rest = super().resolve_command(ctx, args)
        if command is not None:
            flags = {opt: option for option in _options(command) if option.is_flag for opt in _names(option)}
            for given, word in itertools.pairwise(rest):
                if given in flags and word.lower() in FLAG_WORDS:
                    command_ctx = command.context_class(command, info_name=name, parent=ctx)
                    command_ctx.fail(_flag_given_a_value(given, FLAG_WORDS[word.lower()], flags[given], command_ctx))
        return name, command, rest

    def no_such_option(self, option: str, ctx: Context) -> str:
        """click's "no such option", naming the commands that have it, or else the command's nearest option."""
        where = f" for {ctx.info_name}" if ctx.command is not self else ""
        owners = [
            f"textgen {name}"
            for name, command in self.commands.items()
            if command is not ctx.command and any(option in _names(o) for o in _options(command))
        ]
        if owners:
            return f"no such option {option}{where} (it is an option of {_and(owners)})"
        names = [name for o in _options(ctx.command) for name in _names(o)]
        longer = [name for name in names if name.startswith(option)]  # --seq for --seq-len, before --seed
        near = longer if len(longer) == 1 else difflib.get_close_matches(option, names, 1)
        return f"no such option {option}{where}{f' (did you mean {near[0]}?)' if near else ''}"


def _options(command: Command) -> list[TyperOption]:
    """The options a command shows (``--help`` aside)."""
    return [p for p in command.params if isinstance(p, TyperOption) and not p.hidden]


def _names(option: TyperOption) -> list[str]:
    return [*option.opts, *option.secondary_opts]


def _flag_given_a_value(flag: str, on: bool, option: TyperOption, ctx: Context) -> str:
    """What to write instead of a flag followed by a word such as true or no: the flag, its --no- form, or nothing."""
    wanted = option.opts if on == (flag in option.opts) else option.secondary_opts
    instead = f"write {ctx.command_path} {wanted[0]}" if wanted else "leave it out for off"
    return f"{flag} is a flag and takes no value: {instead}"


def _and(names: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return " and ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)


@contextlib.contextmanager
def errors() -> Iterator[None]:
    """Turn library errors, failed reads and writes, and Ctrl-C into one line on stderr and a non-zero exit; and
    the library's warnings into one "warning:" line each."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always", TextgenWarning)  # every time: a REPL or a test may load twice
            warnings.showwarning = functools.partial(_show_warning, warnings.showwarning)
            yield
    except TextgenError as exc:
        ui.show_error(err_console, exc)
        if isinstance(exc, ClusterError):
            # TensorFlow's collectives are aborted for good in this process, and tearing the interpreter down
            # prints a leaked thread pool's traceback: leave at once, everything is saved.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(exc.exit_code)
        raise typer.Exit(exc.exit_code) from None
    except KeyboardInterrupt:
        err_console.print("[yellow]interrupted[/]")
        raise typer.Exit(130) from None
    except BrokenPipeError:  # the reader stopped early (| head): click ends quietly, with exit code 1
        raise
    except OSError as exc:  # a file the library does not check first (a full disk, a read-only directory)
        ui.show_os_error(err_console, exc)
        raise typer.Exit(1) from None


def _show_warning(show: Any, message: Warning | str, category: type[Warning], *args: Any, **kwargs: Any) -> None:
    """``warnings.showwarning`` for a command: textgen's warnings on one line, others as ``show`` shows them."""
    if issubclass(category, TextgenWarning):
        ui.warn(err_console, str(message))
    else:
        show(message, category, *args, **kwargs)
