"""This process and its host: what a key's environment is, where the compile caches live, what torch
needs patched here, and the compiler a package is built with.

    fingerprint     the environment fingerprint (torch, triton, CUDA, Python, device) and ``shape_signature``
    envfiles        the same fingerprint read from files, without importing torch (a restore started early)
    keyenv          the environment a key is made with: an env file, the ``CACHESVC_ENV_<FIELD>`` overrides,
                    or the probes
    roots           the snapshot roots: every folder a fresh process reads compile state from
    driver_helpers  Triton's driver helper module, published beside the caches
    torch_fixes     workarounds for torch releases whose warm caches still re-tune kernels
    torch_support   what this process's torch can make and load (the one-file kinds' probes)
    cxx             the compiler a package's wrapper is built with: Inductor's own, its C++ runtime linked in
    collector       the garbage collector's seconds inside a stretch of work (compile()'s phases)

The room is named ``process``, not ``environment``: ``cachesvc_client.environment`` is the public
function (a submodule of that name would replace it as the package's attribute on import). The door is
each module; this ``__init__`` imports nothing, so the key rules stay cheap to import.
"""
