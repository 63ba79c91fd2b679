"""Atomic file replacement: the one way a file that others read is rewritten (and
`staged_dir`, the one way a directory of them is).

The new content goes to a temporary file beside the target (same directory, so
same filesystem), is flushed and fsynced, and only then renamed over the target
with os.replace. A reader, or a process that starts after a crash, finds the old
file or the new one, whole, never a mix and never an empty file. If the write
fails the temporary file is removed and the target is untouched.

`sync_dir=True` also fsyncs the directory after the rename, so the rename itself
survives a power loss: for what a caller has already acknowledged (the serving
index pointer, an upload's candidates, a bundle manifest).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, Literal, overload


def fsync_dir(directory: Path) -> None:
    """Makes the directory's entries (a rename, a new file) durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@overload
def atomic_file(
    path: Path, mode: Literal["w"] = "w", *, sync_dir: bool = False
) -> contextlib.AbstractContextManager[IO[str]]: ...
@overload
def atomic_file(
    path: Path, mode: Literal["wb"], *, sync_dir: bool = False
) -> contextlib.AbstractContextManager[IO[bytes]]: ...
def atomic_file(path: Path, mode: str = "w", *, sync_dir: bool = False) -> contextlib.AbstractContextManager[IO[Any]]:
    """A file to write `path`'s new content into (text as UTF-8 with "w", bytes with "wb"):
    it replaces `path` when the block ends without an exception, and is removed otherwise."""
    return _atomic_file(path, mode, sync_dir)


@contextlib.contextmanager
def _atomic_file(path: Path, mode: str, sync_dir: bool) -> Iterator[IO[Any]]:
    if mode not in ("w", "wb"):
        raise ValueError(f"mode must be 'w' or 'wb', not {mode!r}")
    # A name of this writer's own: two threads or processes replacing one file never share one.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.{uuid.uuid4().hex[:8]}.tmp")
    # O_EXCL with 0o666: created fresh, with the umask's permissions, as open() would give the target.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, mode, encoding="utf-8" if mode == "w" else None) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if sync_dir:
        fsync_dir(path.parent)


def write_atomic(path: Path, data: bytes | str, *, sync_dir: bool = False) -> None:
    """Replaces `path` with `data` (str is written as UTF-8), whole or not at all."""
    if isinstance(data, str):
        with atomic_file(path, "w", sync_dir=sync_dir) as f:
            f.write(data)
    else:
        with atomic_file(path, "wb", sync_dir=sync_dir) as b:
            b.write(data)


def write_json_atomic(path: Path, value: Any, *, indent: int | None = None, sync_dir: bool = False) -> None:
    """`value` as JSON (non-ASCII kept as is), replacing `path` whole; with `indent`, a final newline too."""
    text = json.dumps(value, indent=indent, ensure_ascii=False)
    write_atomic(path, text + "\n" if indent is not None else text, sync_dir=sync_dir)


@contextlib.contextmanager
def staged_dir(final: Path) -> Iterator[Path]:
    """A directory to assemble beside `final` (a bundle, a release): renamed into its place when
    the block ends without an error, an old `final` moved aside first and removed after; removed
    if the block raises, leaving `final` as it was. A reader finds the old directory or the new
    one, whole, except between the two renames."""
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
    staging.chmod(0o755)  # mkdtemp's 0700 would hide it from a service running as another user
    try:
        yield staging
        old = final.with_name(f".{final.name}.old-{uuid.uuid4().hex[:8]}")
        if final.exists():
            final.rename(old)
        staging.rename(final)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # gone already when it was renamed into place
