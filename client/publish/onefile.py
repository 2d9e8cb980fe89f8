"""Publish a one-file kind (mega-cache, aot-function, pt2-package): the file as the one file of a version.

The file is staged alone in a folder (a hard link where it can be) and published through the snapshot's
own publish (``publish.snapshot.publish``) as the root role ``artifact``: the same upload, linking,
signing and commit. Making the file is ``cachesvc_client.onefile``; fetching it back is
``restore.onefile``.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from typing import Dict, Optional

from ..onefile import FILENAMES, ROLE
from ..process import roots as roots_mod
from ..report import PublishReport
from ..shared import keys
from ..transport.api import ServiceAPI
from . import snapshot


def publish_file(api: ServiceAPI, key: dict, kind: str, *, path: str, meta: Dict[str, str],
                 compile_seconds: Optional[float] = None, workers: int = 8) -> PublishReport:
    """Publish the file at ``path`` as the one file of a version of ``kind``."""
    keys.check_kind(kind)
    if kind not in FILENAMES:
        raise ValueError(f"{kind} is a folder snapshot: publish it with CacheClient.publish")
    with tempfile.TemporaryDirectory(prefix="cachesvc-artifact-") as stage:
        staged = os.path.join(stage, FILENAMES[kind])
        try:
            os.link(path, staged)
        except OSError:  # another file system, or links not allowed
            shutil.copyfile(path, staged)
        return snapshot.publish(api, key, [roots_mod.Root(ROLE, stage)], kind=kind, meta=meta,
                                compile_seconds=compile_seconds, workers=workers)
