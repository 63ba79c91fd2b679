"""Encoded chunks kept on disk while a build runs, so that a build killed halfway (a restart, a
SIGKILL, a machine that went away) resumes without encoding its finished chunks again.

A chunk is a file named by the sha1 of its texts, under a folder named by the bundle's checksum:
the same texts through the same bundle give the same file, whatever the build. A build reads the
chunks its own plan names, writes each one as it finishes it (atomically: a torn chunk is never
read), and removes them once its version is committed: the cache is for an interrupted build,
not a store of vectors (those live in the versions' indexes).
"""

from __future__ import annotations

import contextlib
import hashlib
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

    def get(self, texts: Sequence[str]) -> np.ndarray | None:
        """[C, D] the vectors of a chunk encoded before, or None."""
        try:
            vectors: np.ndarray = np.load(self.path(texts))  # [C, D]
        except (OSError, ValueError):  # absent, or unreadable: encode it again
            return None
        # A chunk of another shape (one a build from before `query_side` wrote, with both sides) is
        # encoded again.
        if vectors.ndim != 2 or len(vectors) != len(texts):
            return None
        return vectors

    def put(self, texts: Sequence[str], vectors: np.ndarray) -> None:
        # Builds with the same bundle share the folder (two sets' uploads at once, say): another
        # build's `forget` may remove it, empty, between the mkdir and the write. Then once more.
        for last in (False, True):
            self.folder.mkdir(parents=True, exist_ok=True)
            try:
                with atomic_file(self.path(texts), "wb") as f:
                    np.save(f, vectors.astype(np.float32))
                return
            except FileNotFoundError:
                if last:
                    raise

    def forget(self, chunks: Sequence[Sequence[str]]) -> None:
        """Removes these chunks' files, and the folder once it is empty: rmdir removes only an empty
        one, so another build's chunks written meanwhile keep it (a check, then a remove, raced one)."""
        for texts in chunks:
            self.path(texts).unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # another build's chunks are in it, or it is gone already
            self.folder.rmdir()
