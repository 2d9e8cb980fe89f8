"""The AOTInductor route's child processes (route_aoti): build a package, or run one once.

    python -m cachesvc_client.aoti_child build EXPORTED PACKAGE MODE
    python -m cachesvc_client.aoti_child check PACKAGE GIVEN BACK DEVICE

``build``: EXPORTED is the program route_aoti.export saved; the weightless
package is built at PACKAGE with the self-contained compiler. ``check``:
route_aoti.verify runs it before a package is published: GIVEN (torch.save
of {"constants": {fqn: tensor}, "inputs": [tensor]}) is loaded, the package
is opened the way a hit opens it, run once, and its outputs are saved to
BACK. A crash or an error here stops the publish, not the process that
asked for it.
"""
from __future__ import annotations

import sys


def check(package: str, given: str, back: str, device: str) -> None:
    import torch
    from torch.utils import _pytree as pytree

    from cachesvc_client.route_aoti import Runner

    data = torch.load(given)
    with torch.no_grad():
        out = Runner(package, data["constants"], device)(*data["inputs"])
    torch.save([t.cpu() for t in pytree.tree_leaves(out)], back)


def main(argv) -> int:
    from cachesvc_client import route_aoti
    from cachesvc_client.errors import CacheClientError

    verb, args = argv[0], argv[1:]
    try:
        if verb == "build":
            exported, package, mode = args
            route_aoti.build_here(exported, package, mode or None)
        elif verb == "check":
            check(*args)
        else:
            print(f"unknown verb {verb!r}: build | check", file=sys.stderr)
            return 2
    except CacheClientError as exc:  # a reason the parent reports (its last line)
        print(exc.message, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
