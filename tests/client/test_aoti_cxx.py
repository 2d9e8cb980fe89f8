"""The compiler a package's wrapper is built with carries its own C++ runtime, hidden (client/process/cxx.py).

A package whose wrapper used the process's libstdc++ died of SIGSEGV at load
on the H200 machine, whose compiler was newer than that runtime. These build a real shared library through the wrapping script with
the machine's compiler and read its ELF dynamic section: no libstdc++ needed,
none of its symbols exported. The missing-static-library case needs a
compiler without libstdc++.a, which this machine does not have: a fake one
stands in for it.
"""
from __future__ import annotations

import os
import subprocess

import pytest

from cachesvc_client.one_call import build as package_build, export, support
from cachesvc_client.process import cxx as aoti_cxx
from cachesvc_client.errors import LoadFailed

torch = pytest.importorskip("torch")

SOURCE = r"""
#include <regex>
#include <string>
// what the AOTInductor wrapper's parse_device_str does first: a std::regex over the device string
extern "C" int device_index(const char* s) {
    std::smatch m;
    std::string text(s);
    if (!std::regex_match(text, m, std::regex("(cpu|cuda)(:([0-9]+))?"))) return -2;
    return m[3].matched ? std::stoi(m[3].str()) : -1;
}
"""


def build(tmp_path, cxx, *flags):
    src = tmp_path / "probe.cpp"
    src.write_text(SOURCE)
    out = tmp_path / "probe.so"
    subprocess.run([cxx, "-O1", "-fPIC", *flags, str(src), "-o", str(out)], check=True, capture_output=True)
    return out


def needed(path) -> list:
    dyn = subprocess.run(["readelf", "-d", str(path)], check=True, capture_output=True, text=True).stdout
    return [line.split("[")[1].rstrip("]") for line in dyn.splitlines() if "(NEEDED)" in line]


def exported(path) -> str:
    return subprocess.run(["nm", "-D", "--defined-only", "-C", str(path)], check=True, capture_output=True,
                          text=True).stdout


def test_the_wrapper_links_its_own_hidden_cpp_runtime_and_still_runs(tmp_path):
    import ctypes

    from torch._inductor import cpp_builder

    (tmp_path / "p").mkdir()
    plain = build(tmp_path / "p", cpp_builder.get_cpp_compiler(), "-shared")
    assert any(n.startswith("libstdc++") for n in needed(plain))  # what Inductor builds by itself
    with aoti_cxx.self_contained_compiler() as (cxx, why):
        assert cxx, why
        assert os.path.basename(cxx) == os.path.basename(cpp_builder.get_cpp_compiler())
        (tmp_path / "s").mkdir()
        lib = build(tmp_path / "s", cxx, "-shared")
        folder = os.path.dirname(cxx)
    assert not os.path.exists(folder)  # the private folder goes with the build
    assert not [n for n in needed(lib) if n.startswith(("libstdc++", "libgcc_s"))], needed(lib)
    strong = [line.split()[-1] for line in exported(lib).splitlines() if line.split()[1] in "TDB"]
    assert strong == ["device_index"], strong  # the runtime's own symbols stay private
    # and what the library instantiated from the headers binds to itself (another copy may be older)
    assert "SYMBOLIC" in subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True).stdout
    probe = ctypes.CDLL(str(lib))
    assert probe.device_index(b"cuda:3") == 3 and probe.device_index(b"cpu") == -1


def test_steps_that_do_not_link_a_shared_object_pass_through_unchanged(tmp_path):
    (tmp_path / "main.cpp").write_text("#include <string>\nint main() { return std::string(\"ok\").size() - 2; }\n")
    with aoti_cxx.self_contained_compiler() as (cxx, why):
        assert cxx, why
        subprocess.run([cxx, "-c", str(tmp_path / "main.cpp"), "-o", str(tmp_path / "main.o")], check=True)
        subprocess.run([cxx, str(tmp_path / "main.o"), "-o", str(tmp_path / "main")], check=True)
    assert any(n.startswith("libstdc++") for n in needed(tmp_path / "main"))  # no flags added outside -shared
    assert subprocess.run([str(tmp_path / "main")]).returncode == 0


@pytest.fixture
def compiler_without_static_runtime(tmp_path, monkeypatch):
    """A g++ whose -print-file-name finds no libstdc++.a (as gcc answers when the static library is absent):
    Inductor's compiler here (its config) and in the build's child process ($CXX, which Inductor reads)."""
    fake = tmp_path / "bin" / "g++"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\ncase "$1" in -print-file-name=*) echo "${1#-print-file-name=}";; '
                    '*) exec g++ "$@";; esac\n')
    fake.chmod(0o755)
    monkeypatch.setenv("CXX", str(fake))
    import torch._inductor.config as inductor_config

    with inductor_config.patch({"cpp.cxx": (str(fake),)}):
        yield fake


def test_without_a_static_runtime_no_package_is_built_and_the_error_says_what_to_install(
        compiler_without_static_runtime):
    with aoti_cxx.self_contained_compiler() as (cxx, why):
        assert cxx is None and "libstdc++.a" in why and "install" in why
    work = compiler_without_static_runtime.parent
    export.export(torch.nn.Linear(4, 2), (torch.randn(1, 4),), str(work / "exported.pt2"))
    with pytest.raises(LoadFailed, match="no self-contained package can be built here: .*libstdc"):
        package_build.build(str(work / "exported.pt2"), str(work / "m.pt2"), mode=None)  # the child's reason
    assert not (work / "m.pt2").exists()


def test_a_package_whose_wrapper_uses_the_builders_runtime_is_refused_before_loading():
    meta = {**support.host_meta("cpu"), "torch": torch.__version__}
    assert support.check_host(meta, "cpu") is None
    old = {k: v for k, v in meta.items() if k != "cxx_runtime"}  # what the client before this fix published
    assert "C++ runtime" in support.check_host(old, "cpu")
