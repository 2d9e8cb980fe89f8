"""Blobs in a local directory: the embedded default."""
from __future__ import annotations

import os
import shutil
import stat
import tempfile
import time
from pathlib import Path
from typing import BinaryIO, Iterator, Optional

from . import BlobNotFound, Storage, StorageError


class LocalStorage(Storage):
    def __init__(self, root: str):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        if key.startswith("/") or ".." in key.split("/"):
            raise StorageError(f"bad key {key!r}")
        return self.root / key

    def put_file(self, key: str, path: str) -> None:
        try:
            self._put_file(key, path)
        except OSError as exc:
            raise StorageError(f"cannot store {key}: {exc}") from None

    def _put_file(self, key: str, path: str) -> None:
        dest = self._path(key)
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.replace(path, dest)  # same filesystem: atomic, no copy
            return
        except OSError:
            pass
        # Another filesystem: copy to a temp name beside dest, then rename.
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as out, open(path, "rb") as src:
                shutil.copyfileobj(src, out, 1 << 20)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, dest)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
            if os.path.exists(path):
                os.unlink(path)

    def temp_dir(self) -> str:
        """A folder on the same filesystem, so uploads can be renamed into place."""
        d = self.root / ".incoming"
        d.mkdir(exist_ok=True)
        return str(d)

    def open(self, key: str) -> BinaryIO:
        try:
            return open(self._path(key), "rb")
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise BlobNotFound(key) from None
        except OSError as exc:
            raise StorageError(f"cannot read {key}: {exc}") from None

    def read_range(self, key: str, offset: int, length: int) -> bytes:
        with self.open(key) as f:
            f.seek(offset)
            data = f.read(length)
        if len(data) != length:
            raise StorageError(f"{key} is shorter than {offset} + {length} bytes")
        return data

    def stat(self, key: str) -> Optional[int]:
        try:
            st = self._path(key).stat()
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            raise StorageError(f"cannot stat {key}: {exc}") from None
        return st.st_size if stat.S_ISREG(st.st_mode) else None

    def delete(self, key: str) -> None:
        try:
            self._path(key).unlink()
        except (FileNotFoundError, NotADirectoryError):
            pass
        except OSError as exc:
            raise StorageError(f"cannot delete {key}: {exc}") from None

    def sweep_incoming(self, older_than: float) -> int:
        """Remove uploads left half-received in ``.incoming`` (a service killed mid-upload) that are
        older than ``older_than`` seconds; return how many. GC calls it with the upload lease."""
        removed = 0
        cutoff = time.time() - older_than
        for entry in os.scandir(self.temp_dir()):
            try:
                if entry.is_file(follow_symlinks=False) and entry.stat(follow_symlinks=False).st_mtime < cutoff:
                    os.unlink(entry.path)
                    removed += 1
            except OSError:
                pass  # gone already, or taken by a concurrent sweep
        return removed

    def iter_keys(self, prefix: str = "") -> Iterator[str]:
        for dirpath, dirnames, filenames in os.walk(self.root):
            dirnames[:] = sorted(d for d in dirnames if d != ".incoming")
            for name in sorted(filenames):
                key = os.path.relpath(os.path.join(dirpath, name), self.root).replace(os.sep, "/")
                if key.startswith(prefix):
                    yield key

    def local_path(self, key: str) -> Optional[str]:
        return str(self._path(key))
