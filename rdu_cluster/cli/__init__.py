"""The `rdu-cluster` command line. Each command lives in its own module and is added here."""

from __future__ import annotations

import ast
import errno
import importlib
import importlib.util
import os
import signal
import sys
import traceback
from collections.abc import Iterator, MutableMapping
from importlib.machinery import ModuleSpec
from pathlib import Path
from typing import cast

import click

from rdu_cluster.entry import interrupted
from workloads.checks import show
from workloads.errors import ConfigError

DEBUG_ENV = "RDU_CLUSTER_DEBUG"


class Main(click.Group):
    """Bad input of any kind is one line on stderr and exit code 2, never a traceback; any other
    failure is one "internal error" line and exit 1 (the traceback only under --debug or
    RDU_CLUSTER_DEBUG=1). SIGTERM is handled like Ctrl-C, so writers clean up the same way."""

    def _help_hint(self, e: click.ClickException, argv: list[str]) -> str:
        """Where to read what is accepted: the failing command's --help. Click's parser raises
        some errors (an option missing its value, a flag given one) without a context; the
        command is then the first word of the line that names one."""
        ctx = getattr(e, "ctx", None)
        if ctx is not None:
            return f" (see '{ctx.command_path} --help')"
        name = next((a for a in argv if a in self.commands), None)
        return f" (see 'rdu-cluster {name} --help')" if name else ""

    def main(self, *args, **kwargs):
        kwargs["standalone_mode"] = False
        argv = list(args[0] if args else kwargs.get("args") or sys.argv[1:])
        debug = "--debug" in argv or os.environ.get(DEBUG_ENV, "") not in ("", "0")
        previous = _sigterm_as_interrupt()
        try:
            rv = self._run(*args, **kwargs)
        except click.exceptions.Exit as e:
            sys.exit(e.exit_code)
        except (click.exceptions.Abort, KeyboardInterrupt, _Interrupted):
            click.echo("aborted", err=True)
            sys.exit(130)
        except click.ClickException as e:
            hint = self._help_hint(e, argv)
            click.echo(f"error: {_one_line(e.format_message())}{hint}", err=True)
            sys.exit(2)
        except ConfigError as e:
            click.echo(f"error: {_one_line(str(e))}", err=True)
            sys.exit(2)
        except Exception as e:  # noqa: BLE001 - the last line of defence: one line, exit 1
            if interrupted(e):  # a Ctrl-C that a lazy import (plotly, ray) wrapped
                click.echo("aborted", err=True)
                sys.exit(130)
            if _stdout_failed(e):
                # `rdu-cluster models > /dev/full`, a closed pipe: the output is what cannot
                # be written; stdout goes to /dev/null so the exit's flush cannot fail again
                _discard_stdout()
                click.echo(f"error: standard output: cannot write: {e.strerror or e}", err=True)
                sys.exit(2)
            if isinstance(e, OSError) and e.errno == errno.ENAMETOOLONG:
                # bad input wherever it is met: only a path the user gave is ever too long
                click.echo(f"error: {show(str(e.filename))}: file name too long; at most 255 "
                           "bytes a name, 4,096 a path (Linux)", err=True)
                sys.exit(2)
            if debug:
                traceback.print_exc()
            where = f"; traceback with --debug or {DEBUG_ENV}=1" if not debug else ""
            click.echo(f"internal error: {type(e).__name__}: {_one_line(str(e))}{where}",
                       err=True)
            sys.exit(1)
        finally:
            _restore(previous)
        sys.exit(rv if isinstance(rv, int) else 0)

    def invoke(self, ctx: click.Context):
        # click meets a KeyboardInterrupt in a command with a bare newline on stderr before
        # its Abort: the one line is "aborted", so the interrupt passes click as another type
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            raise _Interrupted from None

    def resolve_command(self, ctx: click.Context, args: list[str]):
        name, cmd, rest = super().resolve_command(ctx, args)
        if cmd is not None and not ctx.resilient_parsing:
            _refuse_unclear(cmd, click.Context(cmd, info_name=name, parent=ctx), rest)
        return name, cmd, rest

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The command list of --help, without importing every command (LazyCommands)."""
        commands = self.commands
        if not isinstance(commands, LazyCommands):
            return super().format_commands(ctx, formatter)
        names = self.list_commands(ctx)
        if names:
            limit = formatter.width - 6 - max(len(n) for n in names)
            with formatter.section("Commands"):
                formatter.write_dl([(n, commands.short_help(n, limit)) for n in names])
        return None

    def _run(self, *args, **kwargs):
        """One command; the calibration profile its --calibration activated ends with it (an
        in-process caller, a test runner, must not inherit it). A command that never imported
        the calibration module activated none (and --help need not load it)."""
        try:
            return super().main(*args, **kwargs)
        finally:
            calibration = sys.modules.get("rdu_cluster.validation.calibration")
            if calibration is not None:
                calibration.activate(None)


class LazyCommands(MutableMapping):
    """A group's commands by name, each imported from its module (the function named like the
    command) on first use. Iterating gives the names without importing anything."""

    def __init__(self, modules: dict[str, str]):
        self.modules = dict(modules)
        self.loaded: dict[str, click.Command] = {}

    def __getitem__(self, name: str) -> click.Command:
        if name not in self.loaded:
            if name not in self.modules:
                raise KeyError(name)
            self.loaded[name] = getattr(importlib.import_module(self.modules[name]), name)
        return self.loaded[name]

    def __setitem__(self, name: str, cmd: click.Command) -> None:
        self.modules.setdefault(name, "")
        self.loaded[name] = cmd

    def __delitem__(self, name: str) -> None:
        del self.modules[name]
        self.loaded.pop(name, None)

    def __iter__(self) -> Iterator[str]:
        return iter(self.modules)

    def __len__(self) -> int:
        return len(self.modules)

    def short_help(self, name: str, limit: int) -> str:
        """The command's one-line help as click makes it from its docstring, read from the
        module's source when the command is not loaded yet."""
        if name in self.loaded:
            return self.loaded[name].get_short_help_str(limit)
        # a module of this package: found, and a source file
        spec = cast(ModuleSpec, importlib.util.find_spec(self.modules[name]))
        tree = ast.parse(Path(cast(str, spec.origin)).read_text(encoding="utf-8"))
        doc = next((ast.get_docstring(f) for f in tree.body
                    if isinstance(f, ast.FunctionDef) and f.name == name), None)
        return click.Command(name, help=doc).get_short_help_str(limit)


def _refuse_unclear(cmd: click.Command, ctx: click.Context, args: list[str]) -> None:
    """An option of one value given twice is refused: click would keep the last one and drop
    the first unseen (`plan --cluster a --cluster b` planned b alone). Flags and repeatable
    options may repeat. An empty value is refused too: commands read '' as the option left out
    (`simulate --draft ''` ran without speculation, `--weights ''` at the model's dtype). Input
    the parser refuses is left to the command's own parse."""
    try:
        values, _, order = cmd.make_parser(ctx).parse_args(args=list(args))
    except click.ClickException:
        return
    help_option = cmd.get_help_option(ctx)
    if help_option is not None and help_option in order:  # --help shows the help regardless
        return
    for param in dict.fromkeys(order):
        if (isinstance(param, click.Option) and not (param.multiple or param.is_flag
                                                     or param.count)
                and (n := order.count(param)) > 1):
            raise click.UsageError(f"{'/'.join(param.opts)}: given {n} times; it takes one "
                                   "value, give it once", ctx=ctx)
        given = values.get(param.name)
        if (isinstance(param, click.Option) and not param.is_flag
                and "" in (given if isinstance(given, list) else [given])):
            raise click.UsageError(f"{'/'.join(param.opts)}: an empty value; give one or leave "
                                   "the option out", ctx=ctx)


def _stdout_failed(e: BaseException) -> bool:
    """A write to standard output failed (a full device, a closed pipe, an I/O error)."""
    return (isinstance(e, OSError) and e.filename is None
            and e.errno in (errno.ENOSPC, errno.EPIPE, errno.EIO, errno.EDQUOT, errno.EBADF))


def _discard_stdout() -> None:
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)
    except (OSError, ValueError):  # no file descriptor (a test's captured stdout)
        pass


class _Interrupted(Exception):
    """Ctrl-C or SIGTERM inside a command (Main.invoke)."""


def _one_line(text: str) -> str:
    return " ".join(text.split())[:2000]


def _sigterm_as_interrupt():
    """SIGTERM raises KeyboardInterrupt, so `kill` unwinds through the same `finally` blocks as
    Ctrl-C (temporary files removed, nothing half-written left). Only in the main thread."""
    def handler(signum, frame):
        raise KeyboardInterrupt

    try:
        return signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread (a test runner's worker)
        return None


def _restore(previous) -> None:
    if previous is not None:
        signal.signal(signal.SIGTERM, previous)


@click.group(cls=Main)
@click.version_option(package_name="rdu-cluster")
@click.option("--debug", is_flag=True, help=f"Show the traceback of an internal error "
              f"(also {DEBUG_ENV}=1).")
def main(debug: bool) -> None:
    """Simulate LLM inference on clusters of SN40L RDU sockets and GPU nodes."""


# Each command is imported when it runs (or its own --help is asked for), not at start-up:
# `rdu-cluster --help` reads the commands' one-line help from their docstrings in the source,
# so it loads none of numpy, pyarrow, scipy, ray or the engine (benchmarks/bench_startup.py).
COMMANDS = {
    "simulate": "rdu_cluster.cli.simulate", "models": "rdu_cluster.cli.catalog",
    "clusters": "rdu_cluster.cli.catalog", "sweep": "rdu_cluster.cli.sweep",
    "validate": "rdu_cluster.cli.validate", "calibrate": "rdu_cluster.cli.calibrate",
    "footprint": "rdu_cluster.cli.footprint", "serve": "rdu_cluster.cli.serve",
    "plan": "rdu_cluster.cli.plan", "report": "rdu_cluster.cli.report",
    "capacity": "rdu_cluster.cli.capacity", "sensitivity": "rdu_cluster.cli.sensitivity",
}
main.commands = LazyCommands(COMMANDS)
