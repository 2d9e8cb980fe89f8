"""harness/models.py's models as the build job takes them (``cachesvc-client build harness.factories:mlp``):
functions of no argument returning ``(model, args)``, the same model and example call a worker builds."""
from __future__ import annotations

import os


def _device() -> str:
    return os.environ.get("HARNESS_DEVICE", "cpu")


def mlp():
    from harness.models import build

    return build("mlp", _device())


def encoder():
    from harness.models import build

    return build("encoder", _device())


def encoder6():
    from harness.models import build

    return build("encoder6", _device())
