"""Small models that compile in seconds on a CPU (and the same on a GPU)."""
from __future__ import annotations

from harness import hf_models

MODELS = ("mlp, mlp-b<N>, mlp-wide, branchy, tiny, encoder, encoder6, torchvision's resnet50, vit_b_16, convnext_tiny, "
          "efficientnet_b0, regnet_y_400mf, and transformers' "
          f"{', '.join(hf_models.FAMILIES)} (-large, -bf16, -fp16: harness/hf_models.py)")


def input_dims(name: str) -> tuple:
    """The example input's dimensions for ``name`` (one float32 tensor), known without torch."""
    dims = {"mlp": (8, 256), "tiny": (8, 64), "mlp-wide": (8, 256), "branchy": (8, 256), "vit_b_16": (8, 3, 224, 224), "encoder": (4, 32, 128), "encoder6": (8, 128, 512), "resnet50": (8, 3, 224, 224),
            "convnext_tiny": (8, 3, 224, 224), "efficientnet_b0": (8, 3, 224, 224),
            "regnet_y_400mf": (8, 3, 224, 224)}
    if name.startswith("mlp-b") and name[5:].isdigit():
        return (int(name[5:]), 256)
    if name not in dims:
        raise SystemExit(f"unknown model {name!r}: {MODELS}")
    return dims[name]


def signature(name: str) -> str:
    """``shape_signature`` of ``build_call(name)``'s inputs, without importing torch (a restore can start first)."""
    if hf_models.is_hf(name):
        return hf_models.signature(name)
    return f"f32[{','.join(str(d) for d in input_dims(name))}]"


def same_threads() -> None:
    """Every harness process that builds a model (a worker, a replay, a build job's factory) runs with the same
    number of intra-op threads, as one container image does: torch.compile guards ``torch.get_num_threads()``
    (Dynamo's GLOBAL_STATE), so a package built with 4 threads is refused, rightly, by a process running 16.
    On the H200's 16 cores a replay that left torch's default was refused every seed's package (2026-12-05)."""
    import os

    import torch

    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))


def build_call(name: str, device: str = "cpu"):
    """Return (model, args, kwargs): how ``name`` is called (transformers' models take keyword arguments)."""
    if hf_models.is_hf(name):
        same_threads()
        return hf_models.build(name, device)
    model, inputs = build(name, device)
    return model, inputs, {}


def build(name: str, device: str = "cpu"):
    """Return (model, example_inputs) for ``name`` (``MODELS``).

    ``mlp-b<N>`` is the mlp with batch N (shape variants of one model: one key each).
    """
    import torch
    from torch import nn

    dims = input_dims(name)
    same_threads()
    torch.manual_seed(0)
    # The fused eval fast path of nn.TransformerEncoder is one opaque kernel: Inductor would
    # have nothing to compile. Off, the encoder compiles (and autotunes) like a real model.
    torch.backends.mha.set_fastpath_enabled(False)
    if name == "mlp" or name.startswith("mlp-b"):  # mlp-b<N>: same model, another input shape: another key
        model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
    elif name == "mlp-wide":  # the mlp with a wider hidden layer: same inputs, another structure
        model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 512), nn.ReLU(), nn.Linear(512, 10))
    elif name == "branchy":  # the mlp with a branch on a tensor's value: a graph break, so no package (a fallback)
        model = _Branchy()
    elif name == "tiny":  # a custom module, from $DEMO_MODEL_DIR/tinynet.py (tests write versions of its code)
        model = _tinynet().Tiny()
    elif name == "encoder":
        layer = nn.TransformerEncoderLayer(d_model=128, nhead=4, dim_feedforward=256, batch_first=True, dropout=0.0)
        model = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
    elif name == "encoder6":  # the GPU transformer: 6 layers, d=512, batch 8, sequence 128
        layer = nn.TransformerEncoderLayer(d_model=512, nhead=8, dim_feedforward=2048, batch_first=True, dropout=0.0)
        model = nn.TransformerEncoder(layer, num_layers=6, enable_nested_tensor=False)
    else:  # a torchvision model (input_dims refused any other name)
        import torchvision

        model = getattr(torchvision.models, name)(weights=None)
    return model.to(device).eval(), (torch.randn(*dims).to(device),)


def _branchy_class():
    from torch import nn

    class Branchy(nn.Module):
        """Which second layer runs depends on the input's values: Dynamo breaks the graph there and
        torch.export refuses it, so the one call finds no package and falls back to torch.compile."""

        def __init__(self):
            super().__init__()
            self.first, self.up, self.down = nn.Linear(256, 512), nn.Linear(512, 512), nn.Linear(512, 512)
            self.last = nn.Linear(512, 10)

        def forward(self, x):
            h = self.first(x).relu()
            h = self.up(h) if h.mean() > 0 else self.down(h)
            return self.last(h.relu())

    return Branchy


def _Branchy():
    return _branchy_class()()


def _tinynet():
    """Import ``tinynet`` from ``$DEMO_MODEL_DIR`` (a deploy's model code: tests change it between runs)."""
    import importlib.util
    import os

    path = os.path.join(os.environ["DEMO_MODEL_DIR"], "tinynet.py")
    spec = importlib.util.spec_from_file_location("tinynet", path)
    module = importlib.util.module_from_spec(spec)
    import sys

    sys.modules["tinynet"] = module
    spec.loader.exec_module(module)
    return module
