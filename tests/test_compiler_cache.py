"""The run's compiler cache (tests/compiler_cache.py): g++ on PATH goes through ccache into one folder
for the whole run, from a container's bare environment too, and a compile seen once is answered from it."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

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


@pytest.mark.skipif(shutil.which("ccache") is None or os.environ.get(compiler_cache.RUN_DIR) is None
                    or os.environ.get("CCACHE_DISABLE"), reason="no ccache here (or CCACHE_DISABLE): the suite runs without it")
def test_a_compile_and_link_in_one_command_is_split_so_the_compile_is_cached(tmp_path):
    """Inductor's JIT kernels: one command compiles a .cpp and links the .so. The second container's is answered
    from the run's cache, its .so works, and no object is left beside it or in its TMPDIR (objects go to the run's
    folder)."""
    import ctypes

    before = compiler_cache.stats()
    for name in ("first", "second"):
        ctr = tmp_path / name
        (ctr / "home").mkdir(parents=True)
        (ctr / "cache").mkdir()
        (ctr / "cache" / "kernel.cpp").write_text('extern "C" int answer(void) { return 42; }\n')
        env = {"PATH": os.environ["PATH"], "HOME": str(ctr / "home"), "TMPDIR": str(ctr)}
        subprocess.run(["g++", str(ctr / "cache" / "kernel.cpp"), "-shared", "-fPIC", "-O2", "-o",
                        str(ctr / "cache" / "kernel.so"), "-lm", "-Wl,--no-as-needed"],
                       env=env, check=True, cwd=ctr, timeout=60)
        assert ctypes.CDLL(str(ctr / "cache" / "kernel.so")).answer() == 42
        assert sorted(p.name for p in (ctr / "cache").iterdir()) == ["kernel.cpp", "kernel.so"]
        assert sorted(p.name for p in ctr.iterdir()) == ["cache", "home"]
    after = compiler_cache.stats()
    assert after["hits"] == before["hits"] + 1 and after["misses"] == before["misses"] + 1, (before, after)


@pytest.mark.skipif(shutil.which("ccache") is None or os.environ.get(compiler_cache.RUN_DIR) is None
                    or os.environ.get("CCACHE_DISABLE"), reason="no ccache here (or CCACHE_DISABLE): the suite runs without it")
def test_a_packages_sources_that_differ_only_in_their_comments_are_one_compile(tmp_path):
    """AOTInductor's wrapper and kernel sources name their own compile commands, with the container's folders, in
    comment lines: the same model's package in the next container is answered from the run's cache all the same,
    and code that differs is compiled."""
    import ctypes

    before = compiler_cache.stats()
    bodies = [("first", 42, "first"), ("second", 42, "second"), ("third", 7, "third")]
    for name, value, folder in bodies:
        ctr = tmp_path / name
        ctr.mkdir()
        source = ctr / "cabc.wrapper.cpp"
        source.write_text(f"// compiled in {ctr}/{folder} by g++ {source}\n"
                          f'extern "C" int answer(void) {{ return {value}; }}  // {folder}\n'
                          f"// g++ {source} -c -o {ctr}/cabc.wrapper.o\n")
        subprocess.run(["g++", "-fPIC", "-O1", "-c", str(source), "-o", str(ctr / "cabc.wrapper.o")],
                       env={"PATH": os.environ["PATH"], "HOME": str(ctr), "TMPDIR": str(ctr)}, check=True, cwd=ctr,
                       timeout=60)
        subprocess.run(["g++", "-shared", str(ctr / "cabc.wrapper.o"), "-o", str(ctr / "w.so")], check=True, timeout=60)
        assert ctypes.CDLL(str(ctr / "w.so")).answer() == value
        assert sorted(p.name for p in ctr.iterdir()) == ["cabc.wrapper.cpp", "cabc.wrapper.o", "w.so"]
    after = compiler_cache.stats()
    # an end-of-line comment is code's line: "first" and "second" differ there, so only whole comment lines go
    assert after["hits"] == before["hits"] and after["misses"] == before["misses"] + 3, (before, after)
    (tmp_path / "fourth").mkdir()
    again = tmp_path / "fourth" / "cdef.wrapper.cpp"  # Inductor names a source by its contents, comments too
    again.write_text((tmp_path / "first" / "cabc.wrapper.cpp").read_text().replace(str(tmp_path / "first"), "/elsewhere"))
    subprocess.run(["g++", "-fPIC", "-O1", "-c", str(again), "-o", str(again.with_suffix(".o"))], check=True,
                   cwd=again.parent, timeout=60)
    assert compiler_cache.stats()["hits"] == after["hits"] + 1


@pytest.mark.skipif(shutil.which("ccache") is None or os.environ.get(compiler_cache.RUN_DIR) is None,
                    reason="no ccache here: the suite runs without it")
def test_a_compile_goes_without_the_line_tables_torch_asks_for_and_keeps_full_debug_info(tmp_path):
    """torch adds -g1 to every C++ compile; the stand-in leaves it out (tests/compiler_cache.py, DROPPED), and only it:
    an object compiled with -g1 through it has no line table, one compiled with -g keeps its debug sections."""
    (tmp_path / "src.cpp").write_text(SOURCE)
    objects = {}
    for flag in ("-g1", "-g"):
        obj = tmp_path / f"src{flag}.o"
        subprocess.run(["g++", "-O1", flag, "-c", str(tmp_path / "src.cpp"), "-o", str(obj)], check=True, cwd=tmp_path,
                       timeout=60)
        objects[flag] = obj.read_bytes()
    assert b".debug_line" not in objects["-g1"] and b".debug_info" not in objects["-g1"]
    assert b".debug_line" in objects["-g"] and b".debug_info" in objects["-g"]


def test_a_failed_compile_fails_the_command_and_leaves_nothing(tmp_path):
    if shutil.which("ccache") is None or os.environ.get(compiler_cache.RUN_DIR) is None:
        pytest.skip("no ccache here: the suite runs without it")
    (tmp_path / "bad.cpp").write_text("this is not C++\n")
    done = subprocess.run(["g++", str(tmp_path / "bad.cpp"), "-shared", "-fPIC", "-o", str(tmp_path / "bad.so")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "error" in done.stderr
    assert not (tmp_path / "bad.so").exists()


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


@pytest.mark.skipif(shutil.which("ccache") is None or os.environ.get(compiler_cache.RUN_DIR) is None
                    or os.environ.get("CCACHE_DISABLE"), reason="no ccache here (or CCACHE_DISABLE): the suite runs without it")
def test_a_package_kernel_is_compiled_with_its_first_header_precompiled_into_the_same_object(tmp_path):
    """A package's kernel source begins with cpp_prefix.h (compiler_cache.FIRST_HEADERS): the stand-in compiles it
    with that header precompiled once for the run, and the object is the one g++ makes alone; a source that
    begins otherwise is compiled as it is."""
    import torch.utils.cpp_extension as ext

    import hashlib

    run = Path(os.environ[compiler_cache.RUN_DIR])
    real = compiler_cache._real_compiler("g++", shutil.which("ccache"))
    flags = ["-O1", "-fPIC", "-std=c++17", *(f"-I{path}" for path in ext.include_paths()), "-c"]
    body = 'extern "C" int answer(void) { return 42; }\n'
    for name, first in (("cabc.kernel.cpp", compiler_cache.FIRST_HEADERS[1]), ("cdef.kernel.cpp", "#include <vector>")):
        source = tmp_path / name
        source.write_text(f"// {source}\n{first}\n{body}")
        stand_in, alone = source.with_suffix(".o"), source.with_suffix(".alone.o")
        subprocess.run(["g++", str(source), *flags, "-o", str(stand_in)], check=True, cwd=tmp_path, timeout=300)
        # g++ alone, on the file the stand-in compiled (the source less its comment line: an object names its file)
        copy = f"\n{first}\n{body}"
        copy_path = run / "objects" / "sources" / f"{hashlib.sha256(copy.encode()).hexdigest()[:40]}.cpp"
        assert copy_path.read_text() == copy
        subprocess.run([real, str(copy_path), *flags, "-o", str(alone)], check=True, cwd=tmp_path, timeout=300)
        assert stand_in.read_bytes() == alone.read_bytes(), name
    headers = run / "objects" / "headers"
    made = [h.read_text().strip() for h in headers.glob("*/first.h") if h.with_suffix(".h.gch").exists()]
    assert compiler_cache.FIRST_HEADERS[1] in made and "#include <vector>" not in made
