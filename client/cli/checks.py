"""The client's own option checks (support.py has those the service's command line shares): key tags, and
torch.compile's keyword arguments as the build job takes them."""
from __future__ import annotations

import ast
from typing import Dict

import click

from ..shared import keys


def tags(ctx: click.Context, param: click.Parameter, values) -> Dict[str, str]:
    tags = {}
    for item in values:
        k, sep, v = item.partition("=")
        if not sep:
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", ctx, param)
        tags[k] = v
    try:
        return keys.check_tags(tags)
    except keys.InvalidKey as exc:
        raise click.BadParameter(str(exc), ctx, param) from None


#: the one call's own parameters: the build sets them from its flags, never from an --option
NOT_OPTIONS = {"model", "args", "kwargs", "name", "mode", "client", "tags", "publish", "dynamic_shapes", "examples",
                "verify", "require_hit"}


def compile_options(ctx: click.Context, param: click.Parameter, values) -> Dict[str, object]:
    """``--option KEY=VALUE``s as torch.compile's keyword arguments: VALUE a Python literal, else the string."""
    options: Dict[str, object] = {}
    for item in values:
        key, sep, text = item.partition("=")
        if not sep or not key.isidentifier():
            raise click.BadParameter(f"{item!r} is not KEY=VALUE (a torch.compile argument: fullgraph=True)", ctx, param)
        if key in NOT_OPTIONS:
            instead = "--mode" if key == "mode" else "--tag" if key == "tags" else "--name" if key == "name" else ""
            raise click.BadParameter(f"{key!r} is not a torch.compile option here: "
                                     f"{f'use {instead}' if instead else 'the build sets it'}", ctx, param)
        if key in options:
            raise click.BadParameter(f"{key!r} is given twice", ctx, param)
        options[key] = literal(text)
    return options


def literal(text: str) -> object:
    """``True``, ``3``, ``{'max_autotune': True}`` as Python values (ast.literal_eval); anything else (``inductor``,
    ``max-autotune``) as the string itself."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return text
