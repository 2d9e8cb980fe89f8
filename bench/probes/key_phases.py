"""Where ``compile()``'s "key" phase goes, by part, in a fresh process (issue 39).

The model table's H100 run put 0.24-0.29 s in the key of the three text models, against 0.01-0.06 s for
the same models on the CPU here. This times each part the key phase runs (compiled.py: the client, the
route, the call spec, the structure, code and config fingerprints), cold (the first time in the process,
as a restart pays it) and again (lru caches warm), and profiles the cold code walk.

    python bench/probes/key_phases.py --models bert-large,llama-large-bf16 [--device cuda]

One JSON line per model; seconds, one sample each; then the code walk's profile (top 15 by cumulative
time) on stderr.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _timed(parts: dict, name: str, fn, *args):
    started = time.perf_counter()
    out = fn(*args)
    parts[name] = round(time.perf_counter() - started, 4)
    return out


def one(name: str, device: str) -> dict:
    sys.path.insert(0, str(REPO))
    from harness.models import build_call

    model, args, kwargs = build_call(name, device)
    from cachesvc_client.client import CacheClient
    from cachesvc_client.one_call import calls, identity, spec as spec_mod, support

    row = {"model": name, "device": device}
    for attempt in ("cold", "again"):
        parts: dict = {}
        _timed(parts, "client", CacheClient)
        inputs = tuple(calls.leaves(args, kwargs)[0])
        _timed(parts, "route", support.choose_route, inputs, {})
        _timed(parts, "spec", lambda: calls.CallSpec(args, kwargs, bool(model.training), forward=model.forward))
        _timed(parts, "structure", spec_mod.structure_fingerprint, model)
        if attempt == "cold":
            prof = cProfile.Profile()
            prof.enable()
        _timed(parts, "code", identity.code_fingerprint, model)
        if attempt == "cold":
            prof.disable()
            text = io.StringIO()
            pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(15)
            print(f"== {name}: the cold code walk ==\n{text.getvalue()}", file=sys.stderr)
        _timed(parts, "config", identity.config_fingerprint, model)
        row[attempt] = parts
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="bert,gpt2,llama")
    p.add_argument("--device", default="cpu")
    p.add_argument("--one", help=argparse.SUPPRESS)  # the child: one model, in its own process
    a = p.parse_args()
    if a.one:
        print(json.dumps(one(a.one, a.device)), flush=True)
        return
    for name in a.models.split(","):  # each in a fresh process: the caches a restart starts with
        subprocess.run([sys.executable, __file__, "--one", name, "--device", a.device], check=False)


if __name__ == "__main__":
    main()
