"""``python -m cachesvc_client.aoti_child PACKAGE GIVEN BACK DEVICE``: run a built package once, in a fresh process.

route_aoti.verify runs it before a package is published: GIVEN (torch.save of
{"constants": {fqn: tensor}, "inputs": [tensor]}) is loaded, the package is
opened the way a hit opens it, run once, and its outputs are saved to BACK.
A crash or an error here stops the publish, not the process that built it.
"""
from __future__ import annotations

import sys


def main(argv) -> int:
    package, given, back, device = argv
    import torch

    from cachesvc_client.route_aoti import Runner
    from torch.utils import _pytree as pytree

    data = torch.load(given)
    with torch.no_grad():
        out = Runner(package, data["constants"], device)(*data["inputs"])
    torch.save([t.cpu() for t in pytree.tree_leaves(out)], back)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
