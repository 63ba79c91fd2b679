"""Encoded chunks kept on disk while a build runs, so that a build killed halfway (a restart, a
SIGKILL, a machine that went away) resumes without encoding its finished chunks again.

A chunk is a file named by the sha1 of its texts, under a folder named by the bundle's checksum:
the same texts through the same bundle give the same file, whatever the build. A build reads the
chunks its own plan names, writes each one as it finishes it (atomically: a torn chunk is never
read), and removes them once its version is committed: the cache is for an interrupted build,
not a store of vectors (those live in the versions' indexes).
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from core.files import atomic_file


class EncodeCache:
    def __init__(self, root: Path, bundle_checksum: str) -> None:
        self.folder = root / bundle_checksum[:32]

    @staticmethod
    def key(texts: Sequence[str]) -> str:
        digest = hashlib.sha1()
        for text in texts:
            digest.update(text.encode("utf-8", "surrogatepass") + b"\0")
        return digest.hexdigest()

    def path(self, texts: Sequence[str]) -> Path:
        return self.folder / f"{self.key(texts)}.npy"

    def get(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray] | None:
        """([C, D] context, [C, D] reply) of a chunk encoded before, or None."""
        try:
            both = np.load(self.path(texts))  # [2, C, D]
        except (OSError, ValueError):  # absent, or unreadable: encode it again
            return None
        if both.ndim != 3 or both.shape[:2] != (2, len(texts)):
            return None
        return both[0], both[1]

    def put(self, texts: Sequence[str], context: np.ndarray, reply: np.ndarray) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        with atomic_file(self.path(texts), "wb") as f:
            np.save(f, np.stack([context, reply]).astype(np.float32))

    def forget(self, chunks: Sequence[Sequence[str]]) -> None:
        """Removes these chunks' files, and the folder once it is empty."""
        for texts in chunks:
            self.path(texts).unlink(missing_ok=True)
        if self.folder.is_dir() and not any(self.folder.iterdir()):
            shutil.rmtree(self.folder, ignore_errors=True)
