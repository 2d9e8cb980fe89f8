"""Blobs in a local directory: the embedded default.

Whoever can write to the folder can replace an object by a symbolic link (to
``/etc/passwd``, to another tenant's files). Nothing here follows one: every
read, stat and write walks the key's folders from the root with
``O_NOFOLLOW`` (``_parent``), so a link anywhere on the way, the object's own
name included, reads as a missing object and is never written through.
"""
from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import time
import uuid
from pathlib import Path
from typing import BinaryIO, Iterator, Optional, Tuple

from .types import BlobNotFound, ShortObject, Storage, StorageError


class LocalStorage(Storage):
    def __init__(self, root: str):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        if key.startswith("/") or ".." in key.split("/"):
            raise StorageError(f"bad key {key!r}")
        return self.root / key

    def _parent(self, key: str, create: bool = False) -> Tuple[int, str]:
        """(a descriptor of the folder holding ``key``, its last name), reached from the root without
        following a link (the caller closes it). Raises FileNotFoundError when a folder on the way is
        missing (and not ``create``) or is not a folder (a link included), StorageError for a bad key."""
        *folders, name = str(self._path(key).relative_to(self.root)).split(os.sep)
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for folder in folders:
                if create:
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(folder, dir_fd=fd)
                try:
                    sub = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.ENOENT):
                        raise FileNotFoundError(f"{key}: {folder} is not a folder") from None
                    raise
                os.close(fd)
                fd = sub
        except BaseException:
            os.close(fd)
            raise
        return fd, name

    def put_file(self, key: str, path: str) -> None:
        try:
            self._put_file(key, path)
        except OSError as exc:
            raise StorageError(f"cannot store {key}: {exc}") from None

    def _put_file(self, key: str, path: str) -> None:
        dir_fd, name = self._parent(key, create=True)  # a linked folder on the way is refused, not written into
        try:
            try:
                os.replace(path, name, dst_dir_fd=dir_fd)  # same filesystem: atomic, no copy
                return
            except OSError:
                pass
            # Another filesystem: copy to a temp name beside the object, then rename.
            tmp = f".tmp-{uuid.uuid4().hex}"
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=dir_fd)
                with os.fdopen(fd, "wb") as out, open(path, "rb") as src:
                    shutil.copyfileobj(src, out, 1 << 20)
                    out.flush()
                    os.fsync(out.fileno())
                os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp, dir_fd=dir_fd)
                if os.path.exists(path):
                    os.unlink(path)
        finally:
            os.close(dir_fd)

    def temp_dir(self) -> str:
        """A folder on the same filesystem, so uploads can be renamed into place. A link in its place is
        removed (never followed: GC's sweep deletes old files in this folder)."""
        d = self.root / ".incoming"
        if d.is_symlink() or (d.exists() and not d.is_dir()):
            d.unlink()
        d.mkdir(exist_ok=True)
        return str(d)

    def open(self, key: str) -> BinaryIO:
        """The object as a file (so it can be sent with sendfile); a link reads as a missing object."""
        try:
            dir_fd, name = self._parent(key)
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dir_fd)
            finally:
                os.close(dir_fd)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise BlobNotFound(key) from None
        except OSError as exc:
            if exc.errno == errno.ELOOP:  # O_NOFOLLOW met a link where the object should be
                raise BlobNotFound(key) from None
            raise StorageError(f"cannot read {key}: {exc}") from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # a folder, a fifo: not an object
            os.close(fd)
            raise BlobNotFound(key)
        return os.fdopen(fd, "rb")

    def read_range(self, key: str, offset: int, length: int) -> bytes:
        with self.open(key) as f:
            f.seek(offset)
            data = f.read(length)
        if len(data) != length:
            raise ShortObject(f"{key} is shorter than {offset} + {length} bytes")
        return data

    def stat(self, key: str) -> Optional[int]:
        """The object's size; None when it is missing, or a link or anything else but a file."""
        try:
            dir_fd, name = self._parent(key)
            try:
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            finally:
                os.close(dir_fd)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            raise StorageError(f"cannot stat {key}: {exc}") from None
        return st.st_size if stat.S_ISREG(st.st_mode) else None

    def delete(self, key: str) -> None:
        """Remove the object (a link in its place is removed, never what it points to)."""
        try:
            dir_fd, name = self._parent(key)
            try:
                os.unlink(name, dir_fd=dir_fd)
            finally:
                os.close(dir_fd)
        except (FileNotFoundError, NotADirectoryError):
            pass
        except OSError as exc:
            raise StorageError(f"cannot delete {key}: {exc}") from None

    def sweep_incoming(self, older_than: float) -> int:
        """Remove uploads left half-received in ``.incoming`` (a service killed mid-upload) that are
        older than ``older_than`` seconds; return how many. GC calls it with the upload lease."""
        removed = 0
        cutoff = time.time() - older_than
        dir_fd = os.open(self.temp_dir(), os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)  # never a linked folder
        try:
            for entry in os.scandir(dir_fd):
                try:
                    if entry.is_file(follow_symlinks=False) and entry.stat(follow_symlinks=False).st_mtime < cutoff:
                        os.unlink(entry.name, dir_fd=dir_fd)
                        removed += 1
                except OSError:
                    pass  # gone already, or taken by a concurrent sweep
        finally:
            os.close(dir_fd)
        return removed

    def iter_keys(self, prefix: str = "") -> Iterator[str]:
        for dirpath, dirnames, filenames in os.walk(self.root):
            dirnames[:] = sorted(d for d in dirnames if d != ".incoming")
            for name in sorted(filenames):
                key = os.path.relpath(os.path.join(dirpath, name), self.root).replace(os.sep, "/")
                if key.startswith(prefix):
                    yield key

    def check(self) -> None:
        """The folder is there, a folder, and open for reading and writing (a volume that was not
        mounted, or went read-only, is not ready)."""
        try:
            os.close(os.open(self.root, os.O_RDONLY | os.O_DIRECTORY))
        except OSError as exc:
            raise StorageError(f"the blob folder {self.root} cannot be opened: {exc.strerror}") from None
        if not os.access(self.root, os.R_OK | os.W_OK | os.X_OK):
            raise StorageError(f"the blob folder {self.root} is not readable and writable by this process")

    def local_path(self, key: str) -> Optional[str]:
        """Where the object lies (for tests and tools); the service reads through ``open``, which follows no link."""
        return str(self._path(key))
