"""Small models that compile in seconds on a CPU (and the same on a GPU)."""
from __future__ import annotations


def build(name: str, device: str = "cpu"):
    """Return (model, example_inputs) for ``name``: mlp | mlp-b<N> | encoder | encoder6 | resnet50.

    ``mlp-b<N>`` is the mlp with batch N (shape variants of one model: one key each).
    """
    import torch
    from torch import nn

    torch.manual_seed(0)
    # The fused eval fast path of nn.TransformerEncoder is one opaque kernel: Inductor would
    # have nothing to compile. Off, the encoder compiles (and autotunes) like a real model.
    torch.backends.mha.set_fastpath_enabled(False)
    if name == "mlp":
        model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
        inputs = (torch.randn(8, 256),)
    elif name.startswith("mlp-b") and name[5:].isdigit():  # same model, another input shape: another key
        model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
        inputs = (torch.randn(int(name[5:]), 256),)
    elif name == "encoder":
        layer = nn.TransformerEncoderLayer(d_model=128, nhead=4, dim_feedforward=256, batch_first=True, dropout=0.0)
        model = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        inputs = (torch.randn(4, 32, 128),)
    elif name == "encoder6":  # the GPU transformer: 6 layers, d=512, batch 8, sequence 128
        layer = nn.TransformerEncoderLayer(d_model=512, nhead=8, dim_feedforward=2048, batch_first=True, dropout=0.0)
        model = nn.TransformerEncoder(layer, num_layers=6, enable_nested_tensor=False)
        inputs = (torch.randn(8, 128, 512),)
    elif name == "resnet50":
        import torchvision

        model = torchvision.models.resnet50(weights=None)
        inputs = (torch.randn(8, 3, 224, 224),)
    else:
        raise SystemExit(f"unknown model {name!r}: mlp, mlp-b<N>, encoder, encoder6, resnet50")
    model = model.to(device).eval()
    return model, tuple(x.to(device) for x in inputs)
