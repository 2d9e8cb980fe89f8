"""Settings of a publishing process that key its compile state apart from the processes that restore it."""
from __future__ import annotations

import os
import sys
from typing import List

from ..process.fingerprint import torch_dir


def keying_warnings() -> List[str]:
    """Settings of this process that key its compile state apart from a process without them.

    torch keys AOTAutograd entries by the whole functorch config; FX graph keys leave it out. A version
    published from a process whose functorch config differs gives processes without the difference FX
    graph hits but AOTAutograd misses: they trace the model's joint graph again (about 2 s of the mlp's
    5 s first call on the CPU, bench/ttfi.py). Two such settings come from the environment, not from the
    user's code: the remote AOTAutograd cache switch (``TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE=1``, or
    ``enable_remote_cache()``) and, in torch 2.13, ``$CI`` (see ``_ci_in_autograd_keys``): a build job on a
    CI runner publishes what the fleet then half-misses. tests/e2e/test_remote_autograd_keying.py pins both.
    """
    config = sys.modules.get("torch._functorch.config")
    warnings = []
    on = (getattr(config, "enable_remote_autograd_cache", None) if config is not None
          else os.environ.get("TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE") == "1")
    if on:
        warnings.append(
            "this process has the remote AOTAutograd cache on (TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE=1 or "
            "enable_remote_cache()), which torch puts in the AOTAutograd cache keys: processes restoring this "
            "version without it will hit the FX graph cache but miss AOTAutograd and trace again. Publish "
            "from a process set up like the ones that restore.")
    if _ci_in_autograd_keys(config):
        warnings.append(
            f"this process has CI={os.environ['CI']!r} in its environment, which this torch reads into its "
            "AOTAutograd cache keys (functorch's error_on_custom_op_aliasing defaults to it): processes "
            "restoring this version without CI will hit the FX graph cache but miss AOTAutograd and trace "
            "again. Set TORCHINDUCTOR_ERROR_ON_CUSTOM_OP_ALIASING to the same value (0 or 1) in the build job "
            "and the fleet, or unset CI where you publish.")
    return warnings


#: the default torch 2.13 gives functorch's ``error_on_custom_op_aliasing``, in its config's source
_CI_DEFAULT = 'default=bool(os.getenv("CI"))'


def _ci_in_autograd_keys(config) -> bool:
    """Whether ``$CI`` sets a functorch option of this process that a process without it has otherwise.

    Set explicitly (``TORCHINDUCTOR_ERROR_ON_CUSTOM_OP_ALIASING``), the option no longer follows CI. A
    process that never imported torch (the CLI publishing a container's files) asks the installed
    torch's source whether its default follows CI; a torch without the option has nothing to warn of.
    """
    if not os.environ.get("CI") or os.environ.get("TORCHINDUCTOR_ERROR_ON_CUSTOM_OP_ALIASING"):
        return False
    if config is not None:
        return bool(getattr(config, "error_on_custom_op_aliasing", False))
    folder = torch_dir()
    if folder is None:
        return False
    try:
        with open(os.path.join(folder, "_functorch", "config.py"), encoding="utf-8") as f:
            return _CI_DEFAULT in f.read()
    except (OSError, ValueError):
        return False
