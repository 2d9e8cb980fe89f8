"""`cachesvc-client`: restore and publish from init containers and sidecars.

Exit status: 0 on a hit or a normal miss (a miss is not a failure: the app
compiles cold), 1 on a miss or error with --strict, 2 on bad arguments.
"""
from __future__ import annotations

import json
import logging
import sys

import click

from .client import CacheClient
from .errors import CacheClientError
from .fingerprint import environment
from .keys import DEFAULT_KIND, KINDS


def _tags(values):
    tags = {}
    for item in values:
        k, sep, v = item.partition("=")
        if not sep:
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint="--tag")
        tags[k] = v
    return tags


def _common(f):
    options = [
        click.option("--name", required=True, help="Model or service name."),
        click.option("--shape", required=True, help="Input-shape signature, e.g. 'f32[8,256]'."),
        click.option("--tag", "tags", multiple=True, metavar="KEY=VALUE", help="Extra key tag (repeatable)."),
        click.option("--url", envvar="CACHESVC_URL", required=True, help="Service URL [env CACHESVC_URL]."),
        click.option("--token", envvar="CACHESVC_TOKEN", default=None, help="Bearer token [env CACHESVC_TOKEN]."),
        click.option("--cache-dir", envvar="TORCHINDUCTOR_CACHE_DIR", default=None,
                     help="Inductor cache dir [env TORCHINDUCTOR_CACHE_DIR; torch's default otherwise]."),
        click.option("--timeout", default=30.0, show_default=True, help="Seconds to reach the service."),
        click.option("--json", "as_json", is_flag=True, help="Print the report as JSON."),
        click.option("-q", "--quiet", is_flag=True, help="Only warnings."),
    ]
    for opt in reversed(options):
        f = opt(f)
    return f


def _setup_logging(quiet: bool) -> None:
    logging.basicConfig(level=logging.WARNING if quiet else logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(message)s")


@click.group()
def main():
    """Publish and restore torch.compile state through a cachesvc service."""


@main.command()
@_common
@click.option("--stall-timeout", default=30.0, show_default=True, help="Seconds a transfer may stall.")
@click.option("--budget", default=300.0, show_default=True, help="Seconds the whole restore may take.")
@click.option("--strict", is_flag=True, help="Exit 1 on a miss or any error.")
@click.option("--fallback", "fallbacks", default="", metavar="STEPS",
              help="Comma-separated steps tried in order when the exact key has no version: shape (same key, any "
                   "shape), shapes (the most restored shapes, unioned), name (same environment, any name).")
@click.option("--fallback-max-bytes", type=int, default=None, help="Byte budget of the shapes step.")
@click.option("--kind", type=click.Choice(KINDS), default=DEFAULT_KIND, show_default=True,
              help="Version kind. Other kinds than the snapshot are one file, fetched under "
                   "<cache dir>/.cachesvc/artifacts/ (the report's 'artifacts'); the app loads it.")
def restore(name, shape, tags, url, token, cache_dir, timeout, as_json, quiet, stall_timeout, budget, strict, fallbacks,
            fallback_max_bytes, kind):
    """Fetch the newest matching version into the cache dir. A miss names the nearest entries and the
    key fields that differ."""
    _setup_logging(quiet)
    client = CacheClient(url, token, cache_dir, timeout=timeout, stall_timeout=stall_timeout, budget=budget)
    steps = [s.strip() for s in fallbacks.split(",") if s.strip()]
    try:
        report = client.restore(name, shape, _tags(tags), strict=strict, fallbacks=steps,
                                fallback_max_bytes=fallback_max_bytes, kind=kind)
    except (CacheClientError, OSError) as exc:
        click.echo(f"cachesvc-client: restore failed: {getattr(exc, 'message', None) or exc}", err=True)
        sys.exit(1)
    click.echo(json.dumps(report.to_dict(), indent=2) if as_json else report.summary())


@main.command()
@_common
@click.option("--compile-seconds", type=float, default=None, help="Cold compile time to record.")
@click.option("--min-compile-seconds", type=float, envvar="CACHESVC_MIN_COMPILE_SECONDS", default=0.0,
              show_default=True, help="Skip the publish when --compile-seconds is under this "
                                      "[env CACHESVC_MIN_COMPILE_SECONDS].")
@click.option("--no-merge", is_flag=True, help="Do not union with the key's newest version.")
def publish(name, shape, tags, url, token, cache_dir, timeout, as_json, quiet, compile_seconds, min_compile_seconds,
            no_merge):
    """Snapshot the cache dir (and the other roots) and publish it."""
    _setup_logging(quiet)
    client = CacheClient(url, token, cache_dir, timeout=timeout)
    try:
        report = client.publish(name, shape, _tags(tags), compile_seconds=compile_seconds,
                                min_compile_seconds=min_compile_seconds, merge=not no_merge)
    except CacheClientError as exc:
        click.echo(f"cachesvc-client: publish failed: {exc.message}", err=True)
        sys.exit(1)
    click.echo(json.dumps(report.to_dict(), indent=2) if as_json else report.summary())


@main.command()
def env():
    """Print this process's environment fingerprint (part of every key)."""
    click.echo(json.dumps(environment(), indent=2))


if __name__ == "__main__":
    main()
