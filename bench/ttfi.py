"""Time to first inference in a fresh container: cachesvc against the alternatives.

    python bench/ttfi.py [--models mlp,encoder] [--repeats 3] [--out bench/results/benchmarks-ttfi.json]
    python bench/ttfi.py --device cuda --models resnet50,encoder6@max-autotune-no-cudagraphs \
        --contenders cold,cachesvc-local,megacache-s3,tarball-s3 --service-ref worktree   # the H200 rows

A model may carry a torch.compile mode after ``@`` (default: ``default``).

Contenders (each a fresh container: own empty HOME, TMPDIR and cache dir):
  cold            compile from nothing
  floor           the cold container run again: inherits everything it left
  copy-cache-dir  TORCHINDUCTOR_CACHE_DIR copied in (what most teams do)
  cachesvc-local  cachesvc restore, service on its local blob dir
  cachesvc-s3     cachesvc restore, service on S3 (rclone on loopback, presigned URLs)
                  (both start the restore before `import torch`; restore = what was left at the first call)
  cachesvc-local-serial  (only when named in --contenders) the restore after `import torch`, as before
  megacache-s3    torch.compiler.load_cache_artifacts of a blob fetched from S3
  tarball-s3      one .tar.zst of every root per key, fetched from S3 with boto3
  redis           PyTorch's Redis remote caches (FX graph + AOTAutograd), 127.0.0.1:6379
  cachesvc-mega   Mega-Cache through cachesvc: restore(kind="mega-cache", load=True), then torch.compile
  cachesvc-aot    precompiled through cachesvc: an aot_compile'd function (kind aot-function), loaded
                  with load_precompiled in place of torch.compile (where the torch supports it)
  cachesvc-pt2    precompiled through cachesvc: an AOTInductor .pt2 package (kind pt2-package)
  eager           no compile at all: the baseline the one call is measured against
  cachesvc-compile  cachesvc_client.compile(model, inputs, name=...), the one call: a weightless
                  AOTInductor package run by torch's C++ loader (no Dynamo, no Inductor); seeded by
                  a cold container of its own that publishes through the one call
  cachesvc-remote the live remote cache through cachesvc (enable_remote_cache: FX graph + AOTAutograd
                  + autotune), local service; filled by its own cold run per model (seed_remote)
  caching-precompile  (only when named) torch's caching precompile (TORCH_CACHING_PRECOMPILE=1: Dynamo's own cache of
                  traced frames and guards, under the cache dir's dynamo/) through a cachesvc snapshot,
                  then torch.compile; filled by its own cold run per model, under another key name
                  (seed_precompile: save_cache_artifacts writes Dynamo's entries, then it publishes)

A seed container per model compiles once and fills every store (cachesvc
on both backends, Mega-Cache blob, tarball; Redis and the live remote cache
from cold containers of their own, with their settings on: torch keys
AOTAutograd entries by the remote-cache setting); then every round runs all
contenders in a shuffled order. Reported: the restore step, the first
compiled call and their sum; ready (the worker's first line to the first
output: the process start less the interpreter's ~0.03 s) with its ratio to
eager's and the floor's; steady state (median ms per call over --steps calls
after the first) with its ratio to torch.compile's (the floor's); medians over
the rounds.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import random
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import workdir, log, make_tarball, service, service_source, write_json
from bench.ttfi_rows import chart_ready, print_summary, sample_row, summarize
from harness.containers import Container
from harness.s3server import S3Server
from harness.service import ServiceProcess  # noqa: F401 (type in Bench)

CONTENDERS = ["cold", "eager", "cachesvc-compile", "copy-cache-dir", "cachesvc-local", "cachesvc-s3", "megacache-s3", "tarball-s3", "redis",
              "cachesvc-mega", "cachesvc-aot", "cachesvc-pt2", "cachesvc-remote"]
#: contenders that restore a version of another kind from cachesvc (local backend) -> that kind
#: contenders that need the S3 server (and the service on it); without them neither is started
S3_CONTENDERS = ("cachesvc-s3", "megacache-s3", "tarball-s3")
KIND_CONTENDERS = {"cachesvc-mega": "mega-cache", "cachesvc-aot": "aot-function", "cachesvc-pt2": "pt2-package"}
OPTIONAL = ["cachesvc-local-serial", "caching-precompile"]  # run only when --contenders names them


class RedisDB:
    """A Redis database number that was empty when we took it; ``clear()`` removes only what we wrote."""

    def __init__(self, host: str = "127.0.0.1", port: int = 6379):
        import redis

        self.host, self.port = host, port
        for db in range(7, 16):
            r = redis.Redis(host=host, port=port, db=db)
            if r.dbsize() == 0:
                self.db, self.r = db, r
                break
        else:
            raise RuntimeError("no empty Redis database among 7..15")
        self.url = f"redis://{host}:{port}/{self.db}"

    def env(self) -> Dict[str, str]:
        return {"TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE": "1", "TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE": "1",
                "TORCHINDUCTOR_REDIS_URL": self.url}

    def stats(self) -> dict:
        keys = list(self.r.scan_iter("pt2:*"))
        return {"keys": len(keys), "bytes": sum(self.r.strlen(k) for k in keys)}

    def clear(self) -> None:
        for k in list(self.r.scan_iter("pt2:*")):
            self.r.delete(k)


def container_roots(ctr: Container) -> Dict[str, str]:
    """The client's roots for a process in ``ctr`` (see cachesvc_client.process.roots), that exist."""
    from cachesvc_client.process.roots import _username

    default = ctr.tmp / f"torchinductor_{_username()}"
    roots = {"inductor": ctr.cache_dir, "pch": default / "precompiled_headers", "memo": default / "cache",
             "triton": ctr.home / ".triton" / "cache"}
    return {role: str(p) for role, p in roots.items() if p.is_dir()}


def worker_args(model: str, device: str, steps: int = 0) -> List[str]:
    """harness/worker.py's flags for ``model`` (``name`` or ``name@mode``) on ``device``, timing ``steps`` calls."""
    name, _, mode = model.partition("@")
    return ["--model", name, "--mode", mode or "default", "--device", device, "--steps", str(steps)]


class Bench:
    def __init__(self, work: Path, s3: Optional[S3Server], local: ServiceProcess, s3svc: Optional[ServiceProcess],
                 bucket: str, redis_db: Optional[RedisDB], device: str = "cpu", kinds: Optional[List[str]] = None,
                 steps: int = 0, one_call: bool = True):
        """``s3``/``s3svc`` None: no S3 contender runs, the seed fills the local service only;
        ``one_call`` False: no seed through the one call (a cold compile and a package build per model)."""
        self.work, self.s3, self.local, self.s3svc, self.bucket, self.redis = work, s3, local, s3svc, bucket, redis_db
        self.device, self.steps, self.one_call = device, steps, one_call
        #: the other kinds to publish at seed time (those whose contenders run): each costs a compile
        self.kinds = list(KIND_CONTENDERS.values()) if kinds is None else kinds
        self.seeds: Dict[str, dict] = {}
        self._n = 0

    def redis_env(self) -> Dict[str, str]:
        return self.redis.env() if self.redis else {}

    def fresh(self, stem: str) -> Container:
        self._n += 1
        return Container(self.work / "containers", f"{stem}-{self._n}")

    def seed(self, model: str) -> dict:
        """Compile once and fill every store with the result."""
        ctr = self.fresh(f"seed-{model}")
        mega = self.work / f"mega-{model}.bin"
        m = worker_args(model, self.device)
        # No Redis here: torch keys AOTAutograd entries by the remote-cache setting, so a version
        # published from a process with it on misses AOTAutograd in every restore without it
        # (seed_redis fills Redis from its own cold container).
        cold = ctr.run_worker(*m, "--publish", "--after-hook", "bench.contenders:megacache_save",
                              BENCH_MEGA_OUT=str(mega), **self.local.client_env())
        copy_src = self.work / f"copy-src-{model}"
        shutil.copytree(ctr.cache_dir, copy_src, ignore=shutil.ignore_patterns(".cachesvc"))
        seed = {"cold_first_call_s": cold["first_call_s"], "publish_local": cold["publish"],
                "megacache": cold.get("after", {}), "copy_src": str(copy_src)}
        if self.s3 is not None:
            seed.update(self.seed_s3(ctr, model, mega))
        seed["kinds"] = self.seed_kinds(ctr, model)
        if self.one_call:
            seed["compile"] = self.seed_compile(model)
        shutil.rmtree(ctr.root)
        self.seeds[model] = seed
        return seed

    def seed_s3(self, ctr: Container, model: str, mega: Path) -> dict:
        """The S3 stores: cachesvc on S3 (the seed container publishes again), the Mega-Cache blob, the tarball."""
        again = ctr.run_worker(*worker_args(model, self.device), "--publish", **self.s3svc.client_env())
        client = self.s3.client()
        client.upload_file(str(mega), self.bucket, f"mega/{model}.bin")
        tar = self.work / f"tar-{model}.tar.zst"
        tar_info = make_tarball(tar, container_roots(ctr))
        client.upload_file(str(tar), self.bucket, f"tar/{model}.tar.zst")
        return {"publish_s3": again["publish"], "tarball": tar_info}

    def seed_kinds(self, ctr: Container, model: str) -> Dict[str, dict]:
        """Publish the other kinds to cachesvc (local) from the seed container: kind -> publish report or skip."""
        from cachesvc_client.process import torch_support

        out: Dict[str, dict] = {}
        for kind in self.kinds:
            why = torch_support.support(kind)
            if why is None:
                try:
                    r = ctr.run_worker(*worker_args(model, self.device), "--kind", kind, "--publish", **self.local.client_env())
                    out[kind] = dict(r["publish"], first_call_s=r["first_call_s"])
                    continue
                except RuntimeError as exc:  # e.g. a graph break: aot_compile needs one full graph
                    why = failure_line(str(exc))
                    (self.work / f"seed-{model}-{kind}.err").write_text(str(exc))
            log(f"seed {model}: no {kind} version ({why}); its contender is skipped")
            out[kind] = {"skipped": why}
        return out

    def seed_compile(self, model: str) -> dict:
        """A cold container through the one call, publishing (it waits for the background publish)."""
        r = self.cold_once(model, "seed-compile", "--one-call", "--publish", **self.local.client_env())
        return {"first_call_s": r["first_call_s"], "compile": r["compile"], "publish": r["publish"]}

    def cold_once(self, model: str, stem: str, *flags: str, **env: str) -> dict:
        """One cold run of ``model`` in a fresh container that is removed afterwards (seeding a remote cache)."""
        ctr = self.fresh(f"{stem}-{model}")
        try:
            return ctr.run_worker(*worker_args(model, self.device), *flags, **env)
        finally:
            shutil.rmtree(ctr.root, ignore_errors=True)

    def seed_redis(self, model: str) -> None:
        """Fill Redis for ``model`` once: a cold run with PyTorch's Redis remote caches on."""
        if "redis" not in self.seeds[model]:
            r = self.cold_once(model, "seed-redis", **self.redis_env())
            self.seeds[model]["redis"] = {"first_call_s": r["first_call_s"], **self.redis.stats()}

    def seed_remote(self, model: str) -> None:
        """Fill the local service's live remote cache for ``model`` once: a cold run with ``--remote-cache``."""
        if "remote_cache" not in self.seeds[model]:
            r = self.cold_once(model, "seed-remote", "--remote-cache", **self.local.client_env())
            self.seeds[model]["remote_cache"] = {"first_call_s": r["first_call_s"], **r["remote_cache"]}

    def seed_precompile(self, model: str) -> None:
        """Publish ``model`` once from a cold run with torch's caching precompile on, under its own name
        (Dynamo's cache entries are written by save_cache_artifacts, which the after-hook calls)."""
        if "caching_precompile" not in self.seeds[model]:
            r = self.cold_once(model, "seed-precompile", "--name", precompile_name(model), "--publish",
                               "--after-hook", "bench.contenders:megacache_save", TORCH_CACHING_PRECOMPILE="1",
                               BENCH_MEGA_OUT=str(self.work / f"precompile-{model}.bin"), **self.local.client_env())
            self.seeds[model]["caching_precompile"] = {"first_call_s": r["first_call_s"], "publish": r["publish"],
                                                       "saved": r.get("after", {})}

    def run(self, model: str, contender: str) -> List[dict]:
        """One sample of ``contender`` (two for cold: cold, then floor in the same container)."""
        # A fresh container does not inherit the page cache writeback of the one before it: the cold
        # container writes ~200 MB (kernels, the precompiled header), which the kernel flushes ~30 s
        # later, in the middle of whichever contender runs then.
        os.sync()
        ctr = self.fresh(f"{contender}-{model}")
        m = worker_args(model, self.device, self.steps)
        s3env = {**self.s3.env(), "BENCH_BUCKET": self.bucket} if self.s3 is not None else {}
        try:
            if contender == "cold":
                cold = ctr.run_worker(*m)
                os.sync()
                floor = ctr.run_worker(*m)
                return [dict(cold, contender="cold"), dict(floor, contender="floor")]
            if contender == "eager":
                r = ctr.run_worker(*m, "--eager")
            elif contender == "cachesvc-compile":
                r = ctr.run_worker(*m, "--one-call", **self.local.client_env())
            elif contender == "copy-cache-dir":
                r = ctr.run_worker(*m, "--restore-hook", "bench.contenders:copy_cache_dir",
                                   BENCH_COPY_FROM=self.seeds[model]["copy_src"])
            elif contender == "cachesvc-local":
                r = ctr.run_worker(*m, "--restore", **self.local.client_env())
            elif contender == "cachesvc-local-serial":
                r = ctr.run_worker(*m, "--restore", "--restore-after-import", **self.local.client_env())
            elif contender == "cachesvc-s3":
                r = ctr.run_worker(*m, "--restore", **self.s3svc.client_env())
            elif contender == "megacache-s3":
                r = ctr.run_worker(*m, "--restore-hook", "bench.contenders:megacache_s3_load",
                                   BENCH_MEGA_KEY=f"mega/{model}.bin", **s3env)
            elif contender == "tarball-s3":
                r = ctr.run_worker(*m, "--restore-hook", "bench.contenders:tarball_s3",
                                   BENCH_TAR_KEY=f"tar/{model}.tar.zst", **s3env)
            elif contender == "redis":
                self.seed_redis(model)
                r = ctr.run_worker(*m, **self.redis_env())
            elif contender in KIND_CONTENDERS:
                kind = KIND_CONTENDERS[contender]
                if "skipped" in self.seeds[model]["kinds"][kind]:
                    return []
                r = ctr.run_worker(*m, "--kind", kind, "--restore", **self.local.client_env())
            elif contender == "cachesvc-remote":
                self.seed_remote(model)
                r = ctr.run_worker(*m, "--remote-cache", **self.local.client_env())
            elif contender == "caching-precompile":
                self.seed_precompile(model)
                r = ctr.run_worker(*m, "--name", precompile_name(model), "--restore", TORCH_CACHING_PRECOMPILE="1",
                                   **self.local.client_env())
            else:
                raise ValueError(contender)
            return [dict(r, contender=contender)]
        finally:
            shutil.rmtree(ctr.root, ignore_errors=True)


def precompile_name(model: str) -> str:
    """The key name the caching-precompile seed publishes under (its snapshot holds Dynamo's entries too)."""
    return model.partition("@")[0] + "-precompile"


def failure_line(text: str) -> str:
    """The line of a worker's output that says why it failed: the last exception line, else the last line."""
    died = re.match(r"worker failed \((-\d+)\)", text)
    if died:  # killed by a signal: no Python error to show (torch 2.11's AOTInductor segfaulted on the H200)
        import signal

        return f"the worker died of {signal.Signals(-int(died.group(1))).name}"
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    errors = [ln for ln in lines if re.match(r"^[\w.]*(Error|Exception|Unsupported)\b", ln)]
    return (errors or lines or ["?"])[-1][:300]


def device_info(device: str) -> dict:
    """What the rows ran on: the device, and torch's and Triton's versions (in a child: torch stays out of here)."""
    import json
    import subprocess

    code = ("import json, torch\ninfo = {'torch': torch.__version__}\n"
            "try:\n    import triton; info['triton'] = triton.__version__\nexcept ImportError: pass\n"
            "if torch.cuda.is_available(): info['device_name'] = torch.cuda.get_device_name(0)\n"
            "print(json.dumps(info))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    info = json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 and out.stdout.strip() else {}
    return {"device": device, **info}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="mlp,encoder", help="names, each optionally @<torch.compile mode>")
    p.add_argument("--device", default="cpu", help="cpu | cuda")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--contenders", default=",".join(CONTENDERS))
    p.add_argument("--out", default=None, help="write the JSON here")
    p.add_argument("--chart", default=None, help="write a PNG of the time to first output here")
    p.add_argument("--workdir", default=None, help="scratch folder (default: a temp dir, removed)")
    p.add_argument("--steps", type=int, default=50, help="calls timed after the first (steady state)")
    p.add_argument("--service-ref", default="snapshot", help="snapshot | worktree | a git ref")
    args = p.parse_args(argv)
    models = args.models.split(",")
    contenders = args.contenders.split(",")
    unknown = [c for c in contenders if c not in CONTENDERS + OPTIONAL]
    if unknown:
        raise SystemExit(f"unknown contender(s) {', '.join(unknown)}: use {', '.join(CONTENDERS + OPTIONAL)}")
    if "cold" not in contenders:
        raise SystemExit("the cold contender is needed: the floor runs in its container")
    work = workdir(args.workdir, "bench-ttfi-")
    svc_env = service_source(args.service_ref, work / "service-src")
    redis_db = RedisDB() if "redis" in contenders else None
    info = device_info(args.device)
    t0 = time.monotonic()
    try:
        with contextlib.ExitStack() as stack:
            s3 = s3svc = None
            bucket = "bench"
            if any(c in S3_CONTENDERS for c in contenders):
                s3 = stack.enter_context(S3Server(work / "s3"))
                bucket = s3.new_bucket(bucket)
                s3svc = stack.enter_context(service(work / "svc-s3", svc_env, s3.service_env(bucket, "cachesvc")))
            local = stack.enter_context(service(work / "svc-local", svc_env))
            bench = Bench(work, s3, local, s3svc, bucket, redis_db, args.device,
                          [k for c, k in KIND_CONTENDERS.items() if c in contenders], args.steps,
                          one_call="cachesvc-compile" in contenders)
            samples: List[dict] = []

            def document() -> dict:
                return {"section": "ttfi", "models": models, "repeats": args.repeats, "order": "shuffled", **info,
                        "rows": summarize(samples, models, CONTENDERS + OPTIONAL), "samples": samples, "seeds": bench.seeds,
                        "seconds": time.monotonic() - t0}
            for model in models:
                log(f"seed {model}: compile once, fill cachesvc (local{', S3' if s3 else ''}), Mega-Cache"
                    f"{', tarball' if s3 else ''}")
                bench.seed(model)
            for rnd in range(args.repeats):
                for model in models:
                    # A new order each round (seeded: a rerun repeats it). A rotation kept every
                    # contender behind the same one (cachesvc-local always ran right after the
                    # copy-cache-dir container's 17 s of C++ builds).
                    order = contenders[:]
                    random.Random(f"{rnd}/{model}").shuffle(order)
                    for c in order:
                        for r in bench.run(model, c):
                            s = sample_row(r, model, rnd)
                            samples.append(s)
                            if args.out:  # after every sample: a run stopped by a time limit keeps what it measured
                                write_json(Path(args.out), document())
                            log(f"round {rnd + 1}/{args.repeats} {model:8} {s['contender']:15} "
                                f"restore {s['restore_s']:6.2f}  first call {s['first_call_s']:6.2f}  "
                                f"sum {s['total_s']:6.2f}  ready {s['ready_s']:6.2f}  fx hit/miss {s['fxgraph_hit']}/{s['fxgraph_miss']}")
        doc = document()
        print_summary(doc["rows"])
        if args.out:
            write_json(Path(args.out), doc)
        if args.chart:
            chart_ready(doc["rows"], args.chart)
        return doc
    finally:
        if redis_db:
            redis_db.clear()
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
