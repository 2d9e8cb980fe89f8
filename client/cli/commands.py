"""`cachesvc-client`: restore and publish from init containers and sidecars; see what a machine holds.

    cachesvc-client env --json > /etc/cachesvc/env.json     # at image build, in the app image (torch there)
    cachesvc-client restore --env-file /etc/cachesvc/env.json --name N --shape S   # init container, no torch
    cachesvc-client check --env-file /etc/cachesvc/env.json --name N --shape S     # will it hit? (CI gate)
    cachesvc-client status | ls | stats                       # this cache dir; the service's keys; its totals
    cachesvc-client build app.model:build --name N            # nightly, in the app image: build what the fleet serves

Exit status: 0 on a hit or a miss (a miss is not a failure: the app will compile), also
when no service URL is set; 1 on a miss or error with --strict or CACHESVC_REQUIRE_HIT=1, and
when ls/stats/publish fail; 2 on bad arguments, a bad env file or a bad CACHESVC_ENV_<FIELD>,
always as one line naming the flag, file or variable. check: 0 hit, 1 miss, 2 usage, 3 the
service could not answer. build: 0 every planned package exists, 1 some failed or were left out by
the budget, 2 usage (TARGET included). Output: the summary once, on stdout (--json: the
report as JSON); progress and warnings on stderr; -q: warnings only.
"""
from __future__ import annotations

import inspect
import json
import logging
import sys
import warnings
from typing import Callable, Dict, Optional

import click
from click.core import ParameterSource

from .. import __version__
from . import checks, inventory, support
from ..process import keyenv
from ..shared import keys
from .support import CONTEXT_SETTINGS, Size, check_url, one_line, rule
from ..client import REQUIRE_HIT_VAR, CacheClient, require_hit_from_env
from ..errors import CacheClientError
from ..process.fingerprint import environment
from ..shared.keys import DEFAULT_KIND, KINDS
from ..report import RestoreReport

log = logging.getLogger("cachesvc_client")
#: restore and publish default to what CacheClient does (its timeout, stall_timeout and budget)
_CLIENT_DEFAULTS = inspect.signature(CacheClient.__init__).parameters


# -- the key's environment and the client (option checks: checks.py; shared ones: support.py) ---------

def _environment(ctx: click.Context, client: CacheClient) -> Dict[str, str]:
    """The key's environment (env file, CACHESVC_ENV_<FIELD>, this machine), or a usage error naming the culprit."""
    try:
        return client.environment()
    except keyenv.EnvError as exc:
        source = ctx.get_parameter_source("env_file")
        via = f" (from ${keyenv.ENV_FILE_VAR})" if source is ParameterSource.ENVIRONMENT else ""
        raise click.UsageError(f"{exc}{via}", ctx) from None


def _keyed_client(ctx: click.Context, url: Optional[str], token: Optional[str], cache_dir: Optional[str], *,
                  timeout: float, env_file: Optional[str]) -> CacheClient:
    """A client for a command that needs the service and the key's environment: usage errors (exit 2) for
    no URL and for a bad env file or CACHESVC_ENV_<FIELD>."""
    if not url:
        raise click.UsageError("no service URL: pass --url or set CACHESVC_URL", ctx)
    client = CacheClient(url, token, cache_dir, timeout=timeout, env_file=env_file)
    _environment(ctx, client)
    return client


# -- output ---------------------------------------------------------------------------------------

class _OneLine(logging.Formatter):
    """``cachesvc-client: warning: ...`` on one line, however many lines the message had (an HTML body)."""

    def format(self, record: logging.LogRecord) -> str:
        level = "" if record.levelno == logging.INFO else f"{record.levelname.lower()}: "
        return f"cachesvc-client: {level}{one_line(record.getMessage())}"


def _setup_logging(quiet: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_OneLine())
    handler.addFilter(lambda r: not getattr(r, "cachesvc_summary", False))  # printed on stdout instead
    logging.basicConfig(level=logging.WARNING if quiet else logging.INFO, handlers=[handler], force=True)


def _print_report(report, as_json: bool, quiet: bool) -> None:
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
    elif not quiet:
        click.echo(report.summary())


# -- commands -------------------------------------------------------------------------------------

def _service_options(f, timeout: float = 10.0):
    for opt in reversed([
        click.option("--url", envvar="CACHESVC_URL", default=None, callback=rule(check_url),
                     help="Service URL [env CACHESVC_URL]."),
        click.option("--token", envvar="CACHESVC_TOKEN", default=None, help="Bearer token [env CACHESVC_TOKEN]."),
        click.option("--timeout", default=timeout, show_default=True, type=click.FloatRange(0.1, 3600),
                     help="Seconds to reach the service."),
        click.option("--json", "as_json", is_flag=True, help="Print JSON on stdout."),
    ]):
        f = opt(f)
    return f


def _client_service_options(f):
    """The service options with CacheClient's own timeout: for a command that restores and publishes."""
    return _service_options(f, timeout=_CLIENT_DEFAULTS["timeout"].default)


def _key_options(f):
    for opt in reversed([
        click.option("--name", required=True, callback=rule(keys.check_name), help="Model or service name."),
        click.option("--shape", required=True, callback=rule(keys.check_shape),
                     help="Input-shape signature, e.g. 'f32[8,256]'."),
        click.option("--tag", "tags", multiple=True, metavar="KEY=VALUE", callback=checks.tags,
                     help="Extra key tag (repeatable)."),
        click.option("--env-file", envvar=keyenv.ENV_FILE_VAR, default=None, metavar="FILE",
                     help="The key's environment from FILE, written in the app image by `cachesvc-client env "
                          "--json` (for a container without torch or a GPU) [env CACHESVC_ENV_FILE]."),
        click.option("--cache-dir", envvar="TORCHINDUCTOR_CACHE_DIR", default=None,
                     help="Inductor cache dir [env TORCHINDUCTOR_CACHE_DIR; torch's default otherwise]."),
        click.option("-q", "--quiet", is_flag=True, help="Print nothing but warnings and errors (and --json)."),
    ]):
        f = opt(f)
    return _client_service_options(f)


@click.group(context_settings=CONTEXT_SETTINGS)
@click.version_option(__version__, "-V", "--version", prog_name="cachesvc-client", message="%(prog)s %(version)s")
def cli():
    """Publish and restore torch.compile state through a cachesvc service, and see what is held where."""
    # torch imported without numpy (an init image need not have it) warns "Failed to initialize NumPy" on
    # every command that reads the key's environment; no command here uses numpy, so the line says nothing
    warnings.filterwarnings("ignore", message=r"Failed to initialize NumPy", category=UserWarning)


@cli.command()
@_key_options
@click.option("--stall-timeout", default=_CLIENT_DEFAULTS["stall_timeout"].default, show_default=True,
              type=click.FloatRange(0.1), help="Seconds a transfer may stall.")
@click.option("--budget", default=_CLIENT_DEFAULTS["budget"].default, show_default=True, type=click.FloatRange(0.1),
              help="Seconds the whole restore may take.")
@click.option("--strict", is_flag=True, help="Exit 1 on a miss or any error (no URL included); so does "
                                            "CACHESVC_REQUIRE_HIT=1.")
@click.option("--fallback", "fallbacks", default="", metavar="STEPS",
              help="Comma-separated steps tried in order when the exact key has no version: shape (same key, any "
                   "shape), shapes (the most restored shapes, unioned), name (same environment, any name).")
@click.option("--fallback-max-bytes", type=Size(), default=None, metavar="SIZE",
              help="Byte budget of the shapes step (e.g. 2G).")
@click.option("--kind", type=click.Choice(KINDS), default=DEFAULT_KIND, show_default=True,
              help="Version kind. Other kinds than the snapshot are one file, fetched under "
                   "<cache dir>/.cachesvc/artifacts/ (the report's 'artifacts'); the app loads it.")
@click.pass_context
def restore(ctx, *, name, shape, tags, env_file, cache_dir, quiet, url, token, timeout, as_json, stall_timeout, budget,
            strict, fallbacks, fallback_max_bytes, kind):
    """Fetch the newest matching version into the cache dir. A miss names the nearest entries and the
    key fields that differ; it exits 0 (the app will compile) unless --strict."""
    _setup_logging(quiet)
    client = CacheClient(url or "", token, cache_dir, timeout=timeout, stall_timeout=stall_timeout, budget=budget,
                         env_file=env_file)
    _environment(ctx, client)  # a bad env file or CACHESVC_ENV_<FIELD> is a usage error, before anything else
    flag = "--strict" if strict else f"${REQUIRE_HIT_VAR}" if require_hit_from_env() else ""
    if not client.url:
        report = RestoreReport(hit=False, name=name, shape=shape, kind=kind,
                               reason="error: no service URL (--url or CACHESVC_URL)")
        log.warning("no service URL (--url or CACHESVC_URL): restore of %s is a miss; the app will compile", name)
    else:
        steps = [s.strip() for s in fallbacks.split(",") if s.strip()]
        report = client.restore(name, shape, tags, fallbacks=steps, fallback_max_bytes=fallback_max_bytes, kind=kind,
                                require_hit=False)  # a required hit is the exit status here
    error = report.reason.startswith("error: ")  # its warning line said why, on stderr
    # the summary prints on stdout after an error too (a miss is a miss): what a script or a log reads
    _print_report(report, as_json, quiet or bool(flag and not report.hit))
    if flag and not report.hit:
        why = "the restore failed (the warning above says why)" if error else report.summary()
        click.echo(f"cachesvc-client restore: error: {why}; {flag} makes a miss exit 1", err=True)
        sys.exit(1)


@cli.command()
@_key_options
@click.option("--kind", type=click.Choice(KINDS), default=DEFAULT_KIND, show_default=True, help="Version kind.")
@click.pass_context
def check(ctx, *, name, shape, tags, env_file, cache_dir, quiet, url, token, timeout, as_json, kind):
    """Would a restore of this key hit here? Resolves without downloading (and without counting as a restore):
    hit or miss, the entry and version, the bytes it would move; for a miss the nearest entry field by field
    and whether its version passes CACHESVC_TRUSTED_KEYS. Exit 0 hit, 1 miss (also a refused signature),
    2 bad arguments or env file, 3 the service cannot answer (a CI gate: run it before the rollout)."""
    from .. import check as check_mod

    _setup_logging(quiet)
    client = _keyed_client(ctx, url, token, cache_dir, timeout=timeout, env_file=env_file)
    try:
        report = client.check(name, shape, tags, kind=kind)
    except CacheClientError as exc:
        click.echo(f"cachesvc-client check: error: {one_line(exc.message)} (the service could not answer)",
                   err=True)
        sys.exit(check_mod.EXIT_DOWN)
    click.echo(json.dumps(report.to_dict(), indent=2) if as_json else report.summary())
    sys.exit(report.exit_code)


@cli.command()
@_key_options
@click.option("--compile-seconds", type=click.FloatRange(0), default=None, help="Cold compile time to record.")
@click.option("--min-compile-seconds", type=click.FloatRange(0), envvar="CACHESVC_MIN_COMPILE_SECONDS", default=0.0,
              show_default=True, help="Skip the publish when --compile-seconds is under this "
                                      "[env CACHESVC_MIN_COMPILE_SECONDS].")
@click.option("--no-merge", is_flag=True, help="Do not union with the key's newest version.")
@click.pass_context
def publish(ctx, *, name, shape, tags, env_file, cache_dir, quiet, url, token, timeout, as_json, compile_seconds,
            min_compile_seconds, no_merge):
    """Snapshot the cache dir (and the other roots) and publish it."""
    _setup_logging(quiet)
    client = _keyed_client(ctx, url, token, cache_dir, timeout=timeout, env_file=env_file)
    try:
        report = client.publish(name, shape, tags, compile_seconds=compile_seconds,
                                min_compile_seconds=min_compile_seconds, merge=not no_merge)
    except keys.InvalidKey as exc:  # a bad CACHESVC_EXTRA_ROOTS: bad input, named
        raise click.UsageError(str(exc), ctx) from None
    except (CacheClientError, OSError) as exc:
        click.echo(f"cachesvc-client publish: error: {one_line(getattr(exc, 'message', exc))}",
                   err=True)
        sys.exit(1)
    _print_report(report, as_json, quiet)


@cli.command()
@click.argument("path", type=click.Path(dir_okay=False))
@click.option("--comment", default=None, metavar="TEXT",
              help="The public key's comment, shown as who signed (default: USER@HOST).")
def keygen(path, comment):
    """Write an Ed25519 signing key pair: PATH (private, mode 0600) and PATH.pub (one OpenSSH line).

    A builder with CACHESVC_SIGNING_KEY=PATH signs what it publishes; clients with CACHESVC_TRUSTED_KEYS
    (a file of .pub lines) restore only what a trusted key signed. Never overwrites a file."""
    import getpass
    import platform

    from ..shared import signing

    try:
        fp = signing.keygen(path, comment if comment is not None else f"{getpass.getuser()}@{platform.node()}")
    except (OSError, signing.SigningError) as exc:
        click.echo(f"cachesvc-client keygen: error: {one_line(str(exc))}", err=True)
        sys.exit(1)
    click.echo(f"{fp} {path} (private, keep it secret) and {path}.pub (give it to the fleet's trusted keys)")


@cli.command("env")
@click.option("--json", "as_json", is_flag=True, help="Print it as an env file (for --env-file).")
def env_command(as_json):
    """This process's environment fingerprint: the key fields restore and publish read here.

    In the app image (at image build, where torch is), `cachesvc-client env --json > /etc/cachesvc/env.json`
    writes the env file a container without torch or a GPU restores with (`restore --env-file`).
    CACHESVC_ENV_<FIELD> overrides a field (e.g. the GPU's name when the build has none)."""
    try:
        env = keyenv.check(environment())
    except keyenv.EnvError as exc:
        raise click.UsageError(str(exc)) from None
    for warning in keyenv.write_warnings(env):
        click.echo(f"cachesvc-client: warning: {warning}", err=True)
    if as_json:
        click.echo(json.dumps(env, indent=2))
    else:
        click.echo("\n".join(f"{k:<7} {v}" for k, v in env.items()))


@cli.command()
@click.option("--cache-dir", envvar="TORCHINDUCTOR_CACHE_DIR", default=None,
              help="Inductor cache dir [env TORCHINDUCTOR_CACHE_DIR; torch's default otherwise].")
@click.option("--json", "as_json", is_flag=True, help="Print JSON on stdout.")
def status(cache_dir, as_json):
    """What was restored into this cache dir: key, version, files, bytes, when, the verify verdict."""
    s = inventory.local_status(CacheClient(cache_dir=cache_dir).cache_dir)
    click.echo(json.dumps(s, indent=2) if as_json else inventory.status_text(s))


def _service(ctx: click.Context, url: Optional[str], token: Optional[str], *, timeout: float):
    if not url:
        raise click.UsageError("no service URL: pass --url or set CACHESVC_URL", ctx)
    return CacheClient(url, token, timeout=timeout).api


def _ask(ctx: click.Context, what: Callable[[], dict]) -> dict:
    try:
        return what()
    except (CacheClientError, OSError) as exc:
        click.echo(f"cachesvc-client {ctx.info_name}: error: {one_line(getattr(exc, 'message', exc))}",
                   err=True)
        sys.exit(1)


@cli.command("ls")
@click.option("--name", help="Only this name.")
@click.option("--shape", help="Only this shape.")
@click.option("--tag", "tag", multiple=True, metavar="KEY=VALUE", help="Only entries with this tag (repeatable).")
@click.option("--torch", help="Only this torch version.")
@click.option("--device", help="Only this device.")
@click.option("--arch", help="Only this arch.")
@click.option("--kind", type=click.Choice(KINDS), help="Only entries with a version of this kind.")
@click.option("--problem", is_flag=True, help="Only entries whose restores get no cache hit.")
@click.option("--sort", type=click.Choice(["newest", "largest", "most_restored", "last_restored"]), default="newest",
              show_default=True)
@click.option("--limit", type=click.IntRange(0), default=100, show_default=True, help="Rows at most; 0: all.")
@click.option("-v", "--versions", is_flag=True, help="One row per version, with restores and the verified hit rate.")
@_service_options
@click.pass_context
def ls_command(ctx, *, name, shape, tag, torch, device, arch, kind, problem, sort, limit, versions, url, token, timeout,
               as_json):
    """Keys (entries) and versions on the service, with sizes, restores and the verified hit rate."""
    filters = {k: v for k, v in dict(name=name, shape=shape, torch=torch, device=device, arch=arch, kind=kind,
                                     sort=sort, tag=list(tag) or None, problem="true" if problem else None).items()
               if v}
    api = _service(ctx, url, token, timeout=timeout)
    listing = _ask(ctx, lambda: inventory.list_entries(api, filters, limit=limit, versions=versions))
    click.echo(json.dumps(listing, indent=2) if as_json else inventory.entries_text(listing, versions=versions))


@cli.command()
@click.option("--days", type=click.IntRange(0, 3660), default=7, show_default=True,
              help="Days of the daily series to show (0: none).")
@_service_options
@click.pass_context
def stats(ctx, *, days, url, token, timeout, as_json):
    """The service's totals: entries, bytes stored, dedup ratio, restores, hit rate, compile time saved."""
    api = _service(ctx, url, token, timeout=timeout)
    got = _ask(ctx, lambda: inventory.service_stats(api, days))
    click.echo(json.dumps(got, indent=2) if as_json else inventory.stats_text(got, days))


@cli.command()
@click.argument("target")
@click.option("--name", required=True, callback=rule(keys.check_name),
              help="The model's name, as the app passes it to cachesvc_client.compile.")
@click.option("--mode", default=None, help="torch.compile's mode, as the app passes it [default: torch's].")
@click.option("--option", "options", multiple=True, metavar="KEY=VALUE", callback=checks.compile_options,
              help="A torch.compile keyword argument, as the app passes it (repeatable); VALUE a Python literal "
                   "(True, 3, \"{'max_autotune': True}\"), else a string.")
@click.option("--tag", "tags", multiple=True, metavar="KEY=VALUE", callback=checks.tags,
              help="A key tag, as the app passes tags= (repeatable).")
@click.option("--max-packages", type=click.IntRange(1, 64), default=8, show_default=True,
              help="Packages the plan builds at most.")
@click.option("--coverage", type=click.FloatRange(0, 1, min_open=True), default=0.99, show_default=True,
              help="The share of the fleet's observed calls the plan must cover.")
@click.option("--budget", type=click.FloatRange(0), default=3600.0, show_default=True, metavar="SECONDS",
              help="No new build starts after this many seconds.")
@click.option("--dry-run", is_flag=True, help="Plan only: build and publish nothing.")
@click.option("-q", "--quiet", is_flag=True, help="Print nothing but warnings and errors (and --json).")
@_client_service_options
@click.pass_context
def build(ctx, *, target, name, mode, options, tags, max_packages, coverage, budget, dry_run, quiet, url, token,
          timeout, as_json):
    """Build and publish the packages that cover the top of the fleet's demand for a model.

    TARGET is MODULE:FUNCTION (imported with the current directory on sys.path) or PATH.py:FUNCTION, a
    function of no arguments that returns (model, args) or (model, args, kwargs): the model and an example
    call. The example is built first through cachesvc_client.compile (its key names the model's key family);
    then the fleet's demand for that family is planned: the busiest exact shapes if they reach --coverage
    within --max-packages, else ranges of the sizes that vary (torch.export.Dim); the planned packages are
    built busiest first within --budget, and those built before are not built again. Needs a write token.
    Exit 0 when every planned package exists, 1 when some failed or were left out, 2 on bad arguments."""
    from .. import build as build_job  # here: torch and the one call load for this command only

    _setup_logging(quiet)
    if not url:
        raise click.UsageError("no service URL: pass --url or set CACHESVC_URL", ctx)
    client = CacheClient(url, token, timeout=timeout)
    if not dry_run and not client.token:
        raise click.UsageError("building publishes: pass --token or set CACHESVC_TOKEN (a write token), or plan "
                               "only with --dry-run", ctx)
    try:  # before the key's environment is probed: a TARGET that is not one is said at once
        example = build_job.load(target)
    except build_job.TargetError as exc:
        raise click.UsageError(str(exc), ctx) from None
    _environment(ctx, client)
    job = build_job.Job(name, mode=mode, options=options, tags=tags or None, max_packages=max_packages,
                        coverage=coverage, budget=budget, dry_run=dry_run)
    try:
        outcome = build_job.run(example, job, client)
    except build_job.JobError as exc:
        click.echo(f"cachesvc-client build: error: {one_line(str(exc))}", err=True)
        sys.exit(1)
    click.echo(json.dumps(outcome.to_dict(), indent=2) if as_json else "\n".join(outcome.lines()))
    sys.exit(0 if outcome.ok else 1)


def main(argv=None) -> None:
    """The console entry point (``cachesvc-client``)."""
    support.run(cli, "cachesvc-client", argv)

