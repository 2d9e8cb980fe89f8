"""The compiler a package's wrapper is built with: Inductor's own, linking the C++ runtime in, hidden.

Why: the wrapper ``.so`` of an AOTInductor package is compiled by whatever
compiler Inductor finds (``$CXX``, else ``g++``) but loaded into a process
whose C++ runtime is whatever ``libstdc++.so.6`` torch brought in. When the
compiler is newer than that runtime, the wrapper's inlined standard-library
code (std::regex in ``parse_device_str``, the first thing the loader runs)
disagrees with the runtime's and the process dies of SIGSEGV. The H200
machine had exactly that: ``CXX=/opt/gcc/bin/g++`` against Ubuntu's
libstdc++ 6.0.33; every package (an mlp too) crashed at load, and the same
packages loaded with the runtime preloaded or linked statically. A builder container and the inference containers
that load its package need not share a runtime either.

So the wrapper is linked with ``-static-libstdc++ -static-libgcc``,
``--exclude-libs,ALL`` (the copy stays private: nothing in the process binds
to it) and ``-Bsymbolic`` (the wrapper's own template instantiations, std::regex's
among them, bind to themselves, not to same-named ones of libtorch or of the
process's runtime, built from other headers). That is safe because the
wrapper talks to libtorch only through AOTInductor's C shim
(``aoti_torch_*``) and exposes only C entry points. The compiler is wrapped
by a two-line shell script that adds those flags to link steps (``-shared``)
and passes everything else through, named like the compiler so Inductor
still recognises gcc or clang.
"""
from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from typing import Any, Dict, Iterator, Optional, Tuple

#: what check_host requires of a package: its wrapper carries its own C++ runtime
RUNTIME = "static-libstdc++"
LINK_FLAGS = "-static-libstdc++ -static-libgcc -Wl,--exclude-libs,ALL -Wl,-Bsymbolic"


def inductor_options(cxx: Optional[str]) -> Dict[str, Any]:
    """Inductor options for every package built here: the self-contained compiler ``cxx`` (when there
    is one) and no precompiled headers. Inductor precompiles its wrapper headers for the one or two
    compiles of a package; in a fresh container that costs more than it saves (the mlp built in 25.9 s
    without, 40.2 s with, 16.6 s of it the header; the same ms per step), and the header's cache key
    holds the wrapper script's path, which is new at every build, so it is never reused."""
    options: Dict[str, Any] = {"aot_inductor.precompile_headers": False}
    if cxx:
        options["cpp.cxx"] = (cxx,)
    return options


@contextlib.contextmanager
def self_contained_compiler() -> Iterator[Tuple[Optional[str], str]]:
    """Yield (path of the wrapping script, "") or (None, why a self-contained wrapper cannot be built here).

    The script lives in a private temporary folder for the build's duration: a fixed path in a shared
    /tmp could be planted by another user, and the compiler step executes it."""
    if not sys.platform.startswith("linux"):
        yield None, f"self-contained packages are built on Linux only (this is {sys.platform})"
        return
    from torch._inductor import cpp_builder

    real = cpp_builder.get_cpp_compiler()
    static = _ask(real, "-print-file-name=libstdc++.a")
    if not (static and os.path.isabs(static) and os.path.exists(static)):
        yield None, (f"{real} has no static libstdc++ (libstdc++.a) to link the package's wrapper with: "
                     "install the compiler's static C++ library (Debian/Ubuntu: libstdc++-<N>-dev)")
        return
    # in Inductor's cache dir: it must allow executing already (Inductor dlopens what it builds there)
    folder = tempfile.mkdtemp(prefix="cachesvc-cxx-", dir=_cache_dir())
    try:
        script = _script(real, folder)
        if not _ask(script, "--version"):
            yield None, f"the compiler wrapper in {folder} does not run (a noexec mount?)"
        else:
            yield script, ""
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _cache_dir() -> str:
    try:
        from torch._inductor.runtime.cache_dir_utils import cache_dir

        path = cache_dir()
        os.makedirs(path, exist_ok=True)
        return path
    except (ImportError, OSError):
        return tempfile.gettempdir()


def _ask(compiler: str, flag: str) -> str:
    try:
        return subprocess.run([compiler, flag], capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _script(real: str, folder: str) -> str:
    """Write the wrapping script into ``folder``; its file name is the compiler's, for Inductor's gcc/clang checks."""
    path = os.path.join(folder, os.path.basename(real))
    with open(path, "w") as f:
        f.write("#!/bin/sh\n# cachesvc_client.process.cxx: link the package's wrapper with its own hidden C++ runtime\n"
                f'case " $* " in\n  *" -shared "*) exec {shlex.quote(real)} "$@" {LINK_FLAGS} ;;\n'
                f'  *) exec {shlex.quote(real)} "$@" ;;\nesac\n')
    os.chmod(path, 0o700)
    return path
