"""How the `cachesvc` commands fail: one line on stderr, exit 2 for a usage error, 1 for anything else.

The service's validation (the request schemas, ``collect.check_criteria``) names request fields
(``keep_latest``); the commands say the flag instead (``--keep-latest``), whether the error came
from the schema in this process (direct mode) or from the service's answer (``--url`` mode).
Standard library and click only: the ``--url`` mode runs where the server's packages are absent.
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator, Tuple

import click

#: top-level modules of the `cachesvc[server]` extra (and what they pull in)
SERVER_MODULES = frozenset({"flask", "flask_smorest", "marshmallow", "webargs", "apispec", "werkzeug", "jinja2",
                            "sqlalchemy", "alembic", "psycopg", "boto3", "botocore", "gunicorn",
                            "prometheus_client"})


class Failure(click.ClickException):
    """Something outside the command line failed (unreachable, refused, not found): exit 1."""

    exit_code = 1


class BadUsage(click.UsageError):
    """A flag's value was refused: exit 2."""

    exit_code = 2


def flag(field: str) -> str:
    """The command-line flag of a request field: ``keep_latest`` -> ``--keep-latest``."""
    return "--" + field.replace("_", "-")


def _pairs(messages: Any, where: Tuple[str, ...] = ()) -> Iterator[Tuple[Tuple[str, ...], str]]:
    if isinstance(messages, dict):
        for k, v in messages.items():
            yield from _pairs(v, where + (str(k),))
    elif isinstance(messages, list):
        for m in messages:
            yield from _pairs(m, where)
    else:
        yield where, str(messages)


def usage_text(message: str, details: Any = None) -> str:
    """A refusal of the request's fields, told in flags.

    ``details`` is what the service puts in an ``invalid_request`` error: the schema's
    messages by field (``{"json": {"keep_latest": [...]}}``, or without the location), or
    ``{"one_of": [fields]}`` when at least one of those fields is needed.
    """
    if isinstance(details, dict) and isinstance(details.get("one_of"), list):
        return f"{message.split(':')[0]}: give one or more of {', '.join(flag(f) for f in details['one_of'])}"
    if isinstance(details, dict):
        parts = []
        for where, msg in _pairs(details):
            fields = [w for w in where if w not in ("json", "query", "_schema") and not w.isdigit()]
            parts.append(f"{flag(fields[-1])}: {msg}" if fields else msg)
        if parts:
            return "; ".join(parts)
    return message


def refusal(code: str, message: str, details: Any = None) -> click.ClickException:
    """The exception for a refused admin request (the service's error code, message and details)."""
    if code in ("invalid_request", "unprocessable_entity", "bad_request"):
        return BadUsage(usage_text(message, details))
    return Failure(message)


@contextlib.contextmanager
def needs_server(*, admin: bool) -> Iterator[None]:
    """Turn a missing server package into one line that says what to install (and, for an admin
    command, that ``--url`` works without it)."""
    try:
        yield
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in SERVER_MODULES:
            raise
        ctx = click.get_current_context(silent=True)
        command = ctx.command_path if ctx is not None else "cachesvc"
        alternative = (", or give --url (CACHESVC_URL) and an admin --token (CACHESVC_TOKEN) to use a running "
                       "service's admin API" if admin else "")
        raise Failure(f"`{command}` needs the server's packages ({exc.name} is not installed): "
                      f"pip install 'cachesvc[server]'{alternative}") from None
