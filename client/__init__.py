"""cachesvc_client: publish and restore torch.compile state through a cachesvc service.

    from cachesvc_client import CacheClient, shape_signature
    client = CacheClient()                      # CACHESVC_URL, CACHESVC_TOKEN, TORCHINDUCTOR_CACHE_DIR
    client.restore(name="resnet50", shape=shape_signature(x))
    ... torch.compile(model)(x) ...
    client.publish(name="resnet50", shape=shape_signature(x))

    # a process without torch or a GPU (an init container) keys with the app's environment:
    client.restore(name="resnet50", shape="f32[8,3,224,224]", env=cachesvc_client.load_env_file("env.json"))

    model = cachesvc_client.compile(model, (x,), name="resnet50")  # a hit: no Dynamo, no Inductor

    cachesvc_client.enable_remote_cache()       # compiles mid-run ask the fleet first (remote_cache.py)

Needs only requests, zstandard, filelock, click and tqdm; torch is imported
lazily from the container.
"""
__version__ = "0.1.0"

from .artifacts import load_precompiled, precompile_function, precompile_package  # noqa: E402
from .client import CacheClient  # noqa: E402
from .compile import CompiledModel, compile  # noqa: E402,A004
from .errors import CacheClientError  # noqa: E402
from .fingerprint import environment, shape_signature  # noqa: E402
from .keyenv import load_env_file  # noqa: E402
from .remote_cache import disable_remote_cache, enable_remote_cache  # noqa: E402
from .report import PublishReport, RestoreReport  # noqa: E402
from .torch_fixes import apply as apply_torch_fixes  # noqa: E402

__all__ = ["CacheClient", "CacheClientError", "CompiledModel", "compile", "PublishReport", "RestoreReport", "apply_torch_fixes",
           "disable_remote_cache", "enable_remote_cache", "environment", "load_env_file", "load_precompiled",
           "precompile_function", "precompile_package", "shape_signature"]
