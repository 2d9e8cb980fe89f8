"""What the one call's key covers beyond the structure (one_call/identity.py), what a hit's binding sees
(one_call/binding.py), and the one-line causes of a fall-back (issue 25, items 4 and 6)."""
from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import types
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from cachesvc_client.one_call import export, identity, installed, spec, support  # noqa: E402
from cachesvc_client.one_call.binding import Binding  # noqa: E402

SOURCE = '''
import torch
from torch import nn

SHIFT = {shift}


def squash(x):
    return torch.{fn}(x) - SHIFT


class Tiny(nn.Module):
    def __init__(self, slope=0.01):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.act = nn.LeakyReLU(slope)
        self.fc2 = nn.Linear(16, 4)

    def middle(self, x):
        return self.act(squash(x)) if x.dtype in {{torch.float32, torch.float64}} else x

    def forward(self, x):
        return self.fc2(self.middle(self.fc1(x)))
'''


def tiny(fn="relu", shift=0.5, slope=0.01):
    """A model class made from source under one module name, as two deploys of one file would be."""
    module = types.ModuleType("tinynet")
    exec(compile(SOURCE.format(fn=fn, shift=shift), "tinynet.py", "exec"), module.__dict__)  # noqa: S102
    return module.Tiny(slope)


def keys(model):
    return spec.structure_fingerprint(model), identity.code_fingerprint(model), identity.config_fingerprint(model)


def test_the_same_code_and_settings_are_the_same_key():
    assert keys(tiny()) == keys(tiny())


@pytest.mark.parametrize("other", [{"fn": "tanh"}, {"shift": 0.25}])
def test_another_helper_or_constant_reached_from_forward_is_another_code_key(other):
    """forward -> middle (a method) -> squash (a function of the same file) -> torch.relu / SHIFT."""
    base, changed = keys(tiny()), keys(tiny(**other))
    assert changed[0] == base[0]  # same names, shapes and classes
    assert changed[1] != base[1] and changed[2] == base[2]


HELPER_CALLER = '''
import torch
from torch import nn
{imports}


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        return self.fc(x) - {call}
'''


def deployed(tmp_path, name, offset, style):
    """Tiny from a folder of two files, as a deploy has them: the model's file imports a helper from the
    other (``from tinyhelp import offset`` or ``import tinyhelp``), each deploy's files under the same
    module names."""
    folder = tmp_path / name
    folder.mkdir()
    (folder / "tinyhelp.py").write_text(f"def offset():\n    return {offset}\n")
    imports, call = {"from": ("from tinyhelp import offset", "offset()"),
                     "module": ("import tinyhelp", "tinyhelp.offset()")}[style]
    (folder / "tinynet.py").write_text(HELPER_CALLER.format(imports=imports, call=call))
    sys.path.insert(0, str(folder))
    try:
        for module in ("tinyhelp", "tinynet"):
            sys.modules.pop(module, None)
        import tinynet
        return tinynet.Tiny()
    finally:
        sys.path.remove(str(folder))
        for module in ("tinyhelp", "tinynet"):
            sys.modules.pop(module, None)


@pytest.mark.parametrize("style", ["from", "module"])
def test_a_helper_changed_in_another_file_of_the_deploy_is_another_code_key(tmp_path, style):
    """The helper lives in another file the model imports: its code is followed there too."""
    same = keys(deployed(tmp_path, "a", 0.5, style)), keys(deployed(tmp_path, "b", 0.5, style))
    assert same[0] == same[1]
    changed = keys(deployed(tmp_path, "c", 1.5, style))
    assert changed[0] == same[0][0] and changed[1] != same[0][1]


def test_an_installed_librarys_code_is_keyed_by_its_version_not_followed():
    """Code from a file under site-packages: the distribution's name and version are in the key."""
    import importlib.metadata

    walker = identity._Walker()
    walker.foreign(pytest.importorskip("yaml").safe_load)
    assert walker.libraries == {"yaml"} and walker.count == 0  # nothing of its bytecode walked
    assert installed.versions("yaml") == f"PyYAML=={importlib.metadata.version('PyYAML')}"


def test_a_namespace_packages_distributions_are_found_by_their_names_not_by_reading_every_one(tmp_path, monkeypatch):
    """``opentelemetry`` is declared by opentelemetry-api, -sdk...: no distribution has its name. They are found
    among the .dist-info folders named after it; every installed distribution's metadata is read only when
    none is (packages_distributions: 0.19 s of a transformers 4.57 model's key)."""
    for dist, version in (("nsdemo_api", "1.0"), ("nsdemo_sdk", "2.1"), ("nsdemox", "9.9")):
        meta = tmp_path / f"{dist}-{version}.dist-info"
        meta.mkdir()
        (meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist.replace('_', '-')}\nVersion: {version}\n")
        (meta / "top_level.txt").write_text("nsdemo\n" if dist != "nsdemox" else "nsdemox\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    installed.versions.cache_clear()
    monkeypatch.setattr(installed, "_distributions", lambda: pytest.fail("read every distribution's metadata"))
    try:
        assert installed.versions("nsdemo") == "nsdemo-api==1.0,nsdemo-sdk==2.1"
    finally:
        installed.versions.cache_clear()
    monkeypatch.setattr(installed, "_distributions", lambda: {"nsother": ["nsother-dist"]})
    assert installed.versions("nsother") == "nsother-dist==?"  # no name like it: every distribution, as before
    installed.versions.cache_clear()


def test_the_metadata_read_as_text_agrees_with_importlibs_parse_for_every_installed_distribution():
    """The key reads a distribution's top-level names from RECORD's text and its name and version from the
    metadata's header lines (a restart's key: transformers' RECORD and long description were half of it);
    for every distribution in this venv, the same answers as importlib.metadata's own readers."""
    checked = 0
    for dist in importlib.metadata.distributions():
        assert installed._name_version(dist) == f"{dist.metadata['Name']}=={dist.version}"
        if not (dist.read_text("top_level.txt") or "").split():
            parsed = {Path(f.parts[0]).stem if len(f.parts) == 1 else f.parts[0] for f in dist.files or () if f.parts}
            assert installed._top_levels(dist) == {n for n in parsed if "." not in n}, dist.metadata["Name"]
            checked += 1
    assert checked > 10  # wheels without top_level.txt (flit, hatchling) are most of this venv


def test_a_quoted_record_and_a_description_that_names_another_package_read_as_importlib_reads_them(tmp_path):
    meta = tmp_path / "odd_pkg-2.0.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: odd-pkg\nVersion: 2.0\n\nName: other\nVersion: 9\n")
    (meta / "RECORD").write_text('"odd,pkg/__init__.py",sha256=x,1\nsolo.py,,\nodd_pkg-2.0.dist-info/RECORD,,\n'
                                 "../../bin/tool,,\n")
    dist = importlib.metadata.PathDistribution(meta)
    assert installed._name_version(dist) == "odd-pkg==2.0"
    parsed = {Path(f.parts[0]).stem if len(f.parts) == 1 else f.parts[0] for f in dist.files or () if f.parts}
    assert installed._top_levels(dist) == {n for n in parsed if "." not in n} == {"odd,pkg", "solo"}
    egg = tmp_path / "eggy-1.0.egg-info"  # no RECORD: importlib's reader of its installed-files.txt
    egg.mkdir()
    (egg / "PKG-INFO").write_text("Metadata-Version: 1.0\nName: eggy\nVersion: 1.0\n")
    (egg / "installed-files.txt").write_text("../eggy/__init__.py\n../eggy_extra.py\n")
    dist = importlib.metadata.PathDistribution(egg)
    assert installed._name_version(dist) == "eggy==1.0"
    parsed = {Path(f.parts[0]).stem if len(f.parts) == 1 else f.parts[0] for f in dist.files or () if f.parts}
    assert installed._top_levels(dist) == {n for n in parsed if "." not in n}  # Python 3.12 reads the file, 3.11 not


def test_another_setting_is_another_config_key():
    base, changed = keys(tiny()), keys(tiny(slope=0.9))  # LeakyReLU(0.01) -> LeakyReLU(0.9)
    assert changed[:2] == base[:2] and changed[2] != base[2]


def test_a_hook_is_code_the_key_covers():
    model = tiny()
    before = identity.code_fingerprint(model)
    model.fc1.register_forward_hook(lambda m, i, o: o * 2)
    assert identity.code_fingerprint(model) != before


def test_a_transformers_config_is_configuration():
    transformers = pytest.importorskip("transformers")

    def bert(**setting):
        cfg = transformers.BertConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=2,
                                      intermediate_size=64, vocab_size=100, **setting)
        return transformers.BertModel(cfg)

    assert keys(bert()) == keys(bert())
    a, b = keys(bert()), keys(bert(layer_norm_eps=1e-5))
    assert a[0] == b[0] and a[2] != b[2]


def test_the_code_key_is_the_same_in_every_process():
    """No address, no set order (PYTHONHASHSEED), no line number or file path in it."""
    code = ("import sys, types; sys.path.insert(0, %r); from tests.client.test_one_call_identity import tiny; "
            "from cachesvc_client.one_call import identity; m = tiny(); "
            "print(identity.code_fingerprint(m), identity.config_fingerprint(m))") % (sys.path[0],)
    seen = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120,
                           env={**__import__("os").environ, "PYTHONHASHSEED": seed}).stdout for seed in ("1", "2")}
    assert len(seen) == 1 and seen.pop().split() == [identity.code_fingerprint(tiny()),
                                                    identity.config_fingerprint(tiny())]


def _same_pointers(tensors, ptrs, indices):
    """torch's ``_tensors_data_ptrs_at_indices_equal`` as CUDA builds define it, for a CPU build."""
    return all(tensors[i].data_ptr() == ptrs[i] for i in indices)


@pytest.fixture(params=["python", "torch"])
def pointer_check(request, monkeypatch):
    """The binding's storage check both ways: the Python loop, and torch's C++ comparison (CUDA builds have
    it; a CPU build runs its definition, so there only the binding's use of it is tested)."""
    name = "_tensors_data_ptrs_at_indices_equal"
    if request.param == "python":
        monkeypatch.delattr(torch._C, name, raising=False)
    else:
        monkeypatch.setattr(torch._C, name, getattr(torch._C, name, _same_pointers), raising=False)
    return request.param


@pytest.mark.parametrize("how", ["assign", "data", "param", "dict"])
def test_the_binding_sees_a_replaced_tensor_and_takes_it_when_it_fits(how, pointer_check):
    model = tiny()
    binding = Binding(model)
    assert (binding._ptrs_equal is not None) == (pointer_check == "torch")  # the path under test
    assert binding.changed() is None
    with torch.no_grad():
        model.fc1.weight.mul_(2)  # in place: the package reads it as it is, nothing to rebind
    assert binding.changed() is None
    new = torch.randn(16, 8)
    if how == "assign":
        model.load_state_dict({**model.state_dict(), "fc1.weight": new}, assign=True)
    elif how == "data":
        model.fc1.weight.data = new
    elif how == "param":
        model.fc1.weight = torch.nn.Parameter(new)
    else:  # straight into the dict: no registration hook fires
        model.fc1._parameters["weight"] = torch.nn.Parameter(new)
    assert binding.changed() == "fc1.weight"
    assert binding.refresh() is None and binding.changed() is None
    assert binding.constants["fc1.weight"].data_ptr() == new.data_ptr()


def test_the_binding_sees_a_buffer_written_straight_into_buffers(pointer_check):
    model = tiny()
    model.act.register_buffer("scale", torch.ones(16))
    binding = Binding(model)
    new = torch.full((16,), 2.0)
    model.act._buffers["scale"] = new  # no registration hook fires
    assert binding.changed() == "act.scale"
    assert binding.refresh() is None and binding.changed() is None
    assert binding.constants["act.scale"].data_ptr() == new.data_ptr()
    model.act._buffers["scale"] = None  # gone: not a tensor the package can run on
    assert binding.changed() == "act.scale"
    assert "not the ones it was built with" in binding.refresh()


def test_a_replaced_tensor_of_another_shape_cannot_be_rebound():
    model = tiny()
    binding = Binding(model)
    model.fc1.weight = torch.nn.Parameter(torch.randn(16, 4))
    assert binding.changed() == "fc1.weight"
    assert "fc1.weight was replaced by a tensor of shape (16, 4)" in binding.refresh()


def test_a_failed_export_says_where_in_one_line():
    class Branchy(torch.nn.Module):
        def forward(self, x):
            if x.sum() > 0:  # data-dependent control flow: torch.export refuses it
                return x + 1
            return x - 1

    with pytest.raises(Exception) as failed:
        export.export(Branchy(), (torch.randn(2, 2),), "/nonexistent/never-written.pt2")
    why = export.why_failed(failed.value)
    assert "\n" not in why and why.startswith(type(failed.value).__name__), why
    assert "test_one_call_identity.py" in why and "in forward: if x.sum() > 0:" in why, why


@pytest.mark.parametrize("value, on", [("1", True), ("true", True), ("YES", True), ("0", False), ("", False)])
def test_require_hit_reads_the_environment(monkeypatch, value, on):
    monkeypatch.setenv(support.REQUIRE_HIT_VAR, value)
    assert support.require_hit(None) is on
    assert support.require_hit(False) is False and support.require_hit(True) is True


VENDORED = '''
import uuid

SESSION = uuid.uuid4().hex  # made anew in every process, as transformers' telemetry SESSION_ID is


def scale(x):
    return x * 2 if SESSION else x
'''

VENDOR_CALLER = '''
import torch
import vendlib


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        return vendlib.scale(self.fc(x))
'''


def vendor_vendlib(folder: Path) -> None:
    """``vendlib`` 1.0 as ``pip install --target folder`` leaves it: the package and its .dist-info."""
    (folder / "vendlib").mkdir(parents=True)
    (folder / "vendlib" / "__init__.py").write_text(VENDORED)
    meta = folder / "vendlib-1.0.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: vendlib\nVersion: 1.0\n")
    (meta / "top_level.txt").write_text("vendlib\n")
    (meta / "RECORD").write_text("vendlib/__init__.py,,\nvendlib-1.0.dist-info/METADATA,,\n")


def test_a_library_installed_outside_site_packages_is_keyed_by_its_version_in_every_process(tmp_path):
    """``pip install --target /opt/libs`` with PYTHONPATH, as the GPU images vendor transformers: no
    site-packages in the path, but the folder holds the distribution's metadata. Its code is keyed by its
    version; followed, the walk read a module-level uuid4 and every process had another key (never a hit)."""
    libs, deploy = tmp_path / "libs", tmp_path / "app"
    vendor_vendlib(libs)
    deploy.mkdir()
    (deploy / "tinyvend.py").write_text(VENDOR_CALLER)
    code = ("import tinyvend; from cachesvc_client.one_call import identity, installed; w = identity._Walker(); "
            "import vendlib; w.foreign(vendlib.scale); "
            "print(identity.code_fingerprint(tinyvend.Tiny()), sorted(w.libraries), installed.versions('vendlib'))")
    env = {**__import__("os").environ, "PYTHONPATH": f"{libs}:{deploy}"}
    seen = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120,
                           env=env, cwd=tmp_path).stdout for _ in range(2)}
    assert len(seen) == 1, seen
    fingerprint, libraries, version = seen.pop().split(" ", 2)
    assert libraries == "['vendlib']" and version.strip() == "vendlib==1.0"


def test_the_deploys_own_package_beside_a_vendored_library_is_followed_whoever_else_declares_its_name(tmp_path):
    """The deploy's ``models/`` (a helper its model's file imports) in the folder where a library was vendored
    (``pip install --target /app``), while a distribution elsewhere also declares a top-level ``models``: it
    is the deploy's code, followed, so a changed helper is another key; keyed by the other distribution's
    version, both were one key."""
    elsewhere = tmp_path / "elsewhere" / "sloppy-1.0.dist-info"
    elsewhere.mkdir(parents=True)
    (elsewhere / "METADATA").write_text("Metadata-Version: 2.1\nName: sloppy\nVersion: 1.0\n")
    (elsewhere / "top_level.txt").write_text("models\n")
    (elsewhere / "RECORD").write_text("models/__init__.py,,\n")
    seen = []
    for shift in (0.5, 1.5):
        app = tmp_path / f"app-{shift}"
        vendor_vendlib(app)
        (app / "models").mkdir()
        (app / "models" / "__init__.py").write_text("")
        (app / "models" / "help.py").write_text(f"def offset():\n    return {shift}\n")
        (app / "serve.py").write_text(HELPER_CALLER.format(imports="from models.help import offset", call="offset()"))
        code = ("from serve import Tiny; from cachesvc_client.one_call import identity; "
                "print(identity.code_fingerprint(Tiny()))")
        env = {**__import__("os").environ, "PYTHONPATH": f"{tmp_path / 'elsewhere'}:{app}"}
        seen.append(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                   timeout=120, env=env, cwd=tmp_path).stdout.strip())
    assert seen[0] != seen[1], seen
