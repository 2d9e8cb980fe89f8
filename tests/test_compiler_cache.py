"""The run's compiler cache (tests/compiler_cache.py): g++ on PATH goes through ccache into one folder
for the whole run, from a container's bare environment too, and a compile seen once is answered from it."""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tests import compiler_cache

SOURCE = "int answer(void) { return 42; }\n"


@pytest.mark.skipif(shutil.which("ccache") is None or os.environ.get(compiler_cache.RUN_DIR) is None
                    or os.environ.get("CCACHE_DISABLE"), reason="no ccache here (or CCACHE_DISABLE): the suite runs without it")
def test_a_bare_containers_compile_is_answered_from_the_runs_cache(tmp_path):
    run = os.environ[compiler_cache.RUN_DIR]
    assert shutil.which("g++") == os.path.join(run, "bin", "g++")
    before = compiler_cache.stats()
    for name in ("first", "second"):  # two containers: their own HOME, TMPDIR and source path, PATH passed on
        ctr = tmp_path / name
        (ctr / "home").mkdir(parents=True)
        (ctr / "src.cpp").write_text(SOURCE)
        env = {"PATH": os.environ["PATH"], "HOME": str(ctr / "home"), "TMPDIR": str(ctr)}
        subprocess.run(["g++", "-O2", "-c", str(ctr / "src.cpp"), "-o", str(ctr / "src.o")], env=env, check=True,
                       cwd=ctr, timeout=60)
        assert (ctr / "src.o").stat().st_size > 0
        assert not any((ctr / "home").iterdir())  # the cache is the run's, not under the container's HOME
    after = compiler_cache.stats()
    assert after["hits"] == before["hits"] + 1 and after["misses"] == before["misses"] + 1, (before, after)


@pytest.mark.skipif(shutil.which("ccache") is None or shutil.which("g++") is None, reason="no ccache or g++ here")
def test_the_real_compiler_is_found_behind_a_ccache_folder_already_on_path(tmp_path, monkeypatch):
    ccache = shutil.which("ccache")
    masquerade = tmp_path / "ccache-bin"  # what /usr/lib/ccache is: compilers' names linked to ccache
    masquerade.mkdir()
    (masquerade / "g++").symlink_to(ccache)
    monkeypatch.setenv("PATH", f"{masquerade}{os.pathsep}{os.environ['PATH']}")
    real = compiler_cache._real_compiler("g++", ccache)
    assert real and os.path.realpath(real) != os.path.realpath(ccache) and not real.startswith(str(masquerade))
    if os.environ.get(compiler_cache.RUN_DIR):  # nor this run's own script, first on PATH
        assert not real.startswith(os.environ[compiler_cache.RUN_DIR]), real
