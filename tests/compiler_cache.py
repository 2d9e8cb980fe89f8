"""A compiler cache for one test run: ccache in front of g++, shared by every process of the run.

The suite is CPU-bound on a 2-core machine, and g++ is a third of its CPU. Most of that is the same
compile again in another simulated container: every cold Inductor process precompiles the same
header (5-7 s), and every AOTInductor package build of the same model compiles the same wrapper and
kernel sources (10 s). Each container must start with an empty Inductor cache (the tests assert what
a cold process compiles and what it restores), so Inductor's own cache cannot be shared; ccache sits
below it: Inductor still writes, compiles and loads every file, and its counters are unchanged.
ccache only answers a compile it has seen, by the hash of its preprocessed input and flags.

What ccache cannot cache it passes to g++: a compile and link in one command (Inductor's JIT kernels
and its ISA probes) and preprocessing. Its folder is made once per run, by the first process that
imports this (pytest's controller, before xdist starts its workers, which inherit it), and removed at
that process's exit, so no run reads another's results. Each compiler on PATH is replaced by a script
naming that folder, so a container started with a bare environment (its own HOME, PATH passed on)
uses it too and writes nothing under its HOME. Without ccache installed, or with ccache's own
``CCACHE_DISABLE=1``, nothing changes but the time. Benchmarks never use it: their cold starts
pay the compiles as a real container does.
"""
from __future__ import annotations

import atexit
import os
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Dict, Optional

#: set by the process that made the run's cache; not CACHESVC_*, which the tests' services drop
RUN_DIR = "TEST_RUN_CCACHE_DIR"
COMPILERS = ("g++", "c++", "gcc", "cc")
#: Inductor writes a header and compiles it at once, so file times would refuse every compile
#: (include_file_mtime/ctime); contents are hashed either way. base_dir (the temp folder, where every
#: container's TMPDIR is) makes their paths in a command line relative; hash_dir keeps -g1's working
#: directory out of the hash.
CONFIG = """\
sloppiness = pch_defines,time_macros,include_file_mtime,include_file_ctime,locale
base_dir = {base_dir}
hash_dir = false
max_size = 5G
"""


#: What the stand-in leaves out of every command: the line tables torch asks for in every C++ compile
#: (``aot_inductor.enable_line_tables``), which nothing in the suite reads (a crash's C++ frames). On the VM of
#: 2026-12-07 they were a quarter of a package wrapper's compile (10.0 s against 7.3 s; a tiny MLP's package
#: built in 38 CPU-s against 42), and 8 MB of each 140 MB precompiled header. Every compile goes through here,
#: so a header and the sources that use it are built alike (a header built with them could serve only
#: compiles that ask for them).
DROPPED = "-g1"
#: the first lines of a CPU package's wrapper and kernel sources (torch's AOTInductor): the headers precompiled for them
FIRST_HEADERS = ("#include <torch/csrc/inductor/aoti_include/cpu.h>", "#include <torch/csrc/inductor/cpp_prefix.h>")
#: The compiler's stand-in. ccache caches compiles (``-c``) only; Inductor builds each JIT kernel with one
#: command that compiles a .cpp and links the .so, which ccache passes to g++ every time. Across the run's
#: containers the same kernels come back (2026-12-05: 288 such commands, 72 distinct sources), so such a
#: command (one source, ``-shared``, ``-o OUT``, no ``-c``) is split: the source compiled through ccache
#: into an object under the run's folder (not beside OUT: the .so's folder is a cache dir the tests snapshot),
#: then that object linked by the same command line. With -c, g++ ignores the link options; the link ignores
#: the compile options. An AOTInductor package's wrapper and kernel sources (``*.wrapper.cpp``,
#: ``*.kernel.cpp``) name in comments the compile commands that build them, with the container's own
#: folders: the same model's package, built in the next container, was a miss every time (2 of a build's
#: compiles, 7 s of its 14 on this VM). Such a source is compiled from a copy without its comment lines (a
#: blank line each: line numbers stay), named by its contents, so the same code is the same compile.
#: A package's wrapper and kernels are the run's costliest compiles, and each model's are new (2026-12-08: 29
#: wrappers of 4-6.6 s, two thirds of the run's compiler time), much of it the header each includes first
#: (a kernel's cpp_prefix.h: 1.0 of its 1.3 s; a wrapper's runtime headers: 1.1 of 4.4 s). The client builds
#: packages without Inductor's precompiled headers (a fresh container builds one package: process/cxx.py says
#: why), so here that first header (``FIRST_HEADERS``) is precompiled once per run for each set of flags, under
#: a lock, and the source compiled with ``-include`` of it: the same tokens read from the precompiled form, the
#: same object file byte for byte. A source that begins otherwise, or a header that failed to build, is
#: compiled as it is.
#: Every command goes without ``-g1`` (DROPPED). Everything else goes to ccache as it is. Plain sh: it runs
#: hundreds of times a run.
SCRIPT = """#!/bin/sh
CCACHE_DIR={cache}
CCACHE_CONFIGPATH={config}
export CCACHE_DIR CCACHE_CONFIGPATH
reset=1
for a in "$@"; do  # -g1 left out: see DROPPED
    [ "$reset" = 1 ] && {{ set --; reset=; }}
    [ "$a" = {dropped} ] || set -- "$@" "$a"
done
src= out= shared= only= n=0 prev=
for a in "$@"; do
    [ "$prev" = -o ] && out=$a
    case $a in
        -c|-E|-S|-M|-MM) only=1 ;;
        -shared) shared=1 ;;
        *.cpp|*.cc|*.c) n=$((n + 1)); src=$a ;;
    esac
    prev=$a
done
swap() {{  # swap OLD NEW cached|plain ARGS...: g++ (through ccache or not) with ARGS, NEW in place of OLD
    old=$1 new=$2 how=$3; shift 3
    reset=1
    for a in "$@"; do
        [ "$reset" = 1 ] && {{ set --; reset=; }}
        if [ "$a" = "$old" ]; then set -- "$@" "$new"; else set -- "$@" "$a"; fi
    done
    if [ "$how" = cached ]; then {ccache} {real} "$@"; else {real} "$@"; fi
}}
precompiled() {{  # precompiled COPY SRC OUT ARGS...: the header a package's source includes first, precompiled once
    copy=$1 src=$2 out=$3; shift 3  # per run for ARGS' flags (under a lock); its path, for -include. Fails: none
    first=$(grep -m1 '^#include' "$copy")
    case $first in {first}) ;; *) return 1 ;; esac
    command -v flock >/dev/null || return 1
    key=$({{ echo "$first"; for a in "$@"; do [ "$a" = "$src" ] || [ "$a" = "$out" ] || printf '%s\\n' "$a"; done; }} \\
          | sha256sum | cut -c1-40)
    dir={objects}/headers/$key
    mkdir -p "$dir" || return 1
    (
        flock 9 || exit 1
        [ -f "$dir/first.h.gch" ] && exit 0
        echo "$first" > "$dir/first.h" || exit 1
        reset=1
        for a in "$@"; do
            [ "$reset" = 1 ] && {{ set --; reset=; }}
            if [ "$a" = "$src" ]; then set -- "$@" "$dir/first.h"
            elif [ "$a" = "$out" ]; then set -- "$@" "$dir/first.h.gch.$$"
            else set -- "$@" "$a"; fi
        done
        {real} -x c++-header "$@" && mv -f "$dir/first.h.gch.$$" "$dir/first.h.gch"
    ) 9>"$dir/lock" && [ -f "$dir/first.h.gch" ] && echo "$dir/first.h"
}}
case $src in
    *.wrapper.cpp|*.kernel.cpp)
        if [ -n "$only" ] && [ "$n" = 1 ]; then
            mkdir -p {objects}/sources
            tmp=$(mktemp {objects}/sources/XXXXXXXX) || exit 1
            sed 's#^//.*##' "$src" > "$tmp" || exit 1
            copy={objects}/sources/$(sha256sum < "$tmp" | cut -c1-40).cpp
            mv -f "$tmp" "$copy"
            if header=$(precompiled "$copy" "$src" "$out" "$@"); then
                swap "$src" "$copy" cached -include "$header" "$@"  # the copy, its first header precompiled
                exit
            fi
            swap "$src" "$copy" cached "$@"  # the copy: SRC less its comment lines
            exit
        fi ;;
esac
if [ -z "$shared" ] || [ -n "$only" ] || [ "$n" != 1 ] || [ -z "$out" ]; then
    exec {ccache} {real} "$@"
fi
compile() {{  # compile OBJ ARGS...: ARGS less "-o OUT", through ccache, into OBJ
    obj=$1; shift
    skip= reset=1
    for a in "$@"; do
        [ "$reset" = 1 ] && {{ set --; reset=; }}
        if [ -n "$skip" ]; then skip=; continue; fi
        [ "$a" = -o ] && {{ skip=1; continue; }}
        set -- "$@" "$a"
    done
    {ccache} {real} "$@" -c -o "$obj"
}}
mkdir -p {objects}
tmp=$(mktemp {objects}/XXXXXXXX) || exit 1
o=$tmp.o  # sh has no locals: the functions' obj is their own copy of this name
compile "$o" "$@" && swap "$src" "$o" plain "$@"  # the link: the object in place of the source
status=$?
rm -f "$tmp" "$o"
exit $status
"""


def enable() -> Optional[Path]:
    """Put this run's ccache in front of the compilers on PATH; its folder, or None without ccache."""
    ccache = shutil.which("ccache")
    if ccache is None:
        return None
    run = os.environ.get(RUN_DIR)
    if not run:
        run = _make_run_dir(ccache)
        os.environ[RUN_DIR] = run
        atexit.register(shutil.rmtree, run, True)
    bin_dir = os.path.join(run, "bin")
    if not os.environ.get("PATH", "").startswith(bin_dir + os.pathsep):
        os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")
    return Path(run)


def _make_run_dir(ccache: str) -> str:
    """The run's folder: its cache, its configuration, and bin/ with one script per compiler."""
    run = tempfile.mkdtemp(prefix="cachesvc-test-ccache-")
    Path(run, "ccache.conf").write_text(CONFIG.format(base_dir=os.path.realpath(tempfile.gettempdir())))
    bin_dir = Path(run, "bin")
    bin_dir.mkdir()
    for name in COMPILERS:
        real = _real_compiler(name, ccache)
        if real is None:
            continue
        # A script, not a symlink to ccache: a container built with a bare environment (its own HOME,
        # PATH passed on) still uses this run's cache, not one under its HOME.
        script = bin_dir / name
        script.write_text(SCRIPT.format(cache=shlex.quote(os.path.join(run, "cache")),
                                        config=shlex.quote(os.path.join(run, "ccache.conf")),
                                        objects=shlex.quote(os.path.join(run, "objects")),
                                        ccache=shlex.quote(ccache), real=shlex.quote(real),
                                        dropped=DROPPED,
                                        first="|".join(f'"{line}"' for line in FIRST_HEADERS)))
        script.chmod(0o755)
    return run


def _real_compiler(name: str, ccache: str) -> Optional[str]:
    """The first ``name`` on PATH that is not ccache itself (a PATH may already hold ccache's own
    masquerade folder, /usr/lib/ccache: ccache handed itself as the compiler refuses to run), nor a
    run's own script."""
    ours = os.path.join(os.environ[RUN_DIR], "bin") if os.environ.get(RUN_DIR) else None
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        if folder == ours:
            continue
        found = shutil.which(name, path=folder)
        if found and os.path.realpath(found) != os.path.realpath(ccache):
            return found
    return None


def stats() -> Dict[str, int]:
    """This run's ccache hits and misses so far (cacheable compiles only)."""
    out = subprocess.run(["ccache", "--print-stats"], capture_output=True, text=True, timeout=30,
                         env=dict(os.environ, CCACHE_DIR=os.path.join(os.environ[RUN_DIR], "cache"))).stdout
    counts = dict(line.split("\t", 1) for line in out.splitlines() if "\t" in line)
    return {"hits": int(counts.get("direct_cache_hit", 0)) + int(counts.get("preprocessed_cache_hit", 0)),
            "misses": int(counts.get("cache_miss", 0))}


def summary() -> Optional[str]:
    """One line of this run's hits, for the end of pytest's report; None when the cache is off."""
    if not os.environ.get(RUN_DIR) or not shutil.which("ccache"):
        return None
    try:
        counts = stats()
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    return (f"compiler cache (ccache, this run only): {counts['hits']} hits, {counts['misses']} misses "
            f"of {counts['hits'] + counts['misses']} cacheable compiles")
