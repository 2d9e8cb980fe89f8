"""What the `cachesvc-client` commands share: help, errors, checked values. (The service's `cachesvc` command
reads sizes with its own type over the shared rule, cachesvc_client.shared.units: the service imports nothing
of the client but its shared rules.)

    from cachesvc_client.cli.support import CONTEXT_SETTINGS, Size, rule, run

    @click.group(context_settings=CONTEXT_SETTINGS)              # -h as well as --help
    @click.version_option(__version__, "--version", prog_name="cachesvc-client")
    def cli(): ...

    @cli.command()
    @click.option("--max-total-bytes", type=Size())              # 500G, 1.5TB, 10GiB, 2048
    @click.option("--name", callback=rule(keys.check_name))     # a shared rule; its ValueError names the flag
    def purge(max_total_bytes, name): ...

    def main(): run(cli, "cachesvc")

``run`` prints every usage error as one line, ``<command path>: error: <what> (see <command> -h)``,
and exits 2; never a traceback for bad input. A value that came from a variable is named by
it (``$CACHESVC_URL``) rather than by its flag.
"""
from __future__ import annotations

import sys
from typing import Callable, Optional, Sequence
from urllib.parse import urlsplit

import click
from click.core import ParameterSource

from ..shared import units

#: -h as well as --help, and help text that uses a wide terminal
CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 110}


def one_line(text: str) -> str:
    """``text`` with every run of whitespace (newlines of an HTML error page included) as one space."""
    return " ".join(str(text).split())


def named(ctx: click.Context, param: click.Parameter) -> Optional[str]:
    """The variable a value came from (``$CACHESVC_URL``), or None when it came from the flag (or a default)."""
    if ctx.get_parameter_source(param.name) is ParameterSource.ENVIRONMENT and param.envvar:
        return f"${param.envvar}"
    return None


def rule(check: Callable[[str], object]):
    """A click callback applying ``check`` (a rule such as ``cachesvc_client.shared.keys.check_name``, raising
    ValueError) to a given value: a bad one is a usage error naming the flag or the variable."""
    def callback(ctx: click.Context, param: click.Parameter, value):
        if value is None:
            return value
        try:
            check(value)
        except ValueError as exc:
            raise click.BadParameter(str(exc), ctx, param, param_hint=named(ctx, param)) from None
        return value
    return callback


def check_url(url: str) -> str:
    """A service URL (``http(s)://host[:port][/prefix]``); ValueError saying what is wrong."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError as exc:
        raise ValueError(f"{url!r} is not a URL ({exc}); write it as http://HOST:PORT") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{url!r} is not a service URL; write it as http://HOST:PORT (or https://)")
    return url


class Size(click.ParamType):
    """A byte size: ``500G``, ``1.5TB``, ``10GiB``, ``2048`` (``cachesvc_client.shared.units.parse_size``)."""

    name = "size"

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            return value
        try:
            return units.parse_size(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


def run(group: click.Group, prog_name: str, argv: Optional[Sequence[str]] = None) -> None:
    """Run ``group`` as the ``prog_name`` console command; exits with its status (see the module docstring)."""
    try:
        code = group.main(args=argv, prog_name=prog_name, standalone_mode=False)
    except getattr(click.exceptions, "NoArgsIsHelpError", ()) as exc:  # click >= 8.2: the bare command
        click.echo(exc.ctx.get_help() if exc.ctx else str(exc), err=True)
        sys.exit(2)
    except click.UsageError as exc:
        where = exc.ctx.command_path if exc.ctx else prog_name
        click.echo(f"{where}: error: {one_line(exc.format_message())} (see {where} -h)", err=True)
        sys.exit(2)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.Abort:
        click.echo(f"{prog_name}: aborted", err=True)
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)
