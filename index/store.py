"""Versioned index directories on the artifact volume.

    indexes/
      CURRENT                  the serving version's name (replaced atomically)
      v20261122T031500-1a2b3c/ one immutable version
        manifest.json  replies.faiss  queries.faiss  candidates.json
        reply_vectors.npy  query_vectors.npy
      .staging-*/              a build in progress; removed at the next start

A version is written into a staging directory, fsynced and renamed into place,
so a reader sees either the whole version or none of it.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from index import ann

MANIFEST = "manifest.json"
POINTER = "CURRENT"
STAGING_PREFIX = ".staging-"


@dataclass
class IndexManifest:
    version: str
    bundle_checksum: str  # vectors from one model are never searched with another
    bundle_name: str
    dim: int
    replies: int
    queries: int
    source: str  # what the candidates came from, e.g. "chitchat:train"
    created_at: str
    build_seconds: float
    ann: dict[str, dict[str, Any]] = field(default_factory=dict)  # "replies"/"queries" -> AnnReport
    checks: dict[str, float] = field(default_factory=dict)  # validation figures measured before commit
    encoded: int = 0  # texts encoded for this version; the rest were reused from an earlier one

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> IndexManifest:
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in raw.items() if k in known})


@dataclass
class IndexVersion:
    """One loaded, immutable version. Requests hold a reference to exactly one."""

    manifest: IndexManifest
    reply_index: faiss.Index
    query_index: faiss.Index
    reply_ids: list[str]  # [R]
    reply_texts: list[str]  # [R]
    query_texts: list[str]  # [Q]
    query_reply_rows: np.ndarray  # [Q] int64: query row -> reply row it was paired with
    # [R, D] float32, memory-mapped: the rerank step reads only its top-k rows.
    reply_vectors: np.ndarray

    @property
    def version(self) -> str:
        return self.manifest.version


def _fsync_tree(directory: Path) -> None:
    for path in directory.iterdir():
        if path.is_file():
            with path.open("rb") as f:
                os.fsync(f.fileno())
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


class IndexStore:
    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, version: str) -> Path:
        return self.root / version

    def versions(self) -> list[str]:
        """Committed versions, oldest first (names sort by creation time)."""
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and (p / MANIFEST).is_file())

    def manifest(self, version: str) -> IndexManifest:
        return IndexManifest.from_dict(json.loads((self.path(version) / MANIFEST).read_text()))

    def current(self) -> str | None:
        pointer = self.root / POINTER
        if not pointer.is_file():
            return None
        version = pointer.read_text().strip()
        return version if (self.path(version) / MANIFEST).is_file() else None

    def set_current(self, version: str) -> None:
        if not (self.path(version) / MANIFEST).is_file():
            raise FileNotFoundError(f"no committed index version {version!r}")
        tmp = self.root / f".{POINTER}.{os.getpid()}"
        tmp.write_text(version + "\n")
        os.replace(tmp, self.root / POINTER)

    def latest_for(self, bundle_checksum: str) -> str | None:
        """The current version if it matches the bundle, else the newest that does."""
        current = self.current()
        if current and self.manifest(current).bundle_checksum == bundle_checksum:
            return current
        matching = [v for v in self.versions() if self.manifest(v).bundle_checksum == bundle_checksum]
        return matching[-1] if matching else None

    def stage(self) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=self.root))

    def commit(self, staging: Path, manifest: IndexManifest) -> Path:
        (staging / MANIFEST).write_text(json.dumps(asdict(manifest), indent=2) + "\n")
        _fsync_tree(staging)
        final = self.path(manifest.version)
        staging.rename(final)
        _fsync_tree(self.root)
        return final

    def remove_staging(self) -> list[str]:
        """Leftovers of builds that crashed; they were never visible to readers."""
        removed = []
        if self.root.is_dir():
            for p in self.root.iterdir():
                if p.name.startswith(STAGING_PREFIX):
                    shutil.rmtree(p, ignore_errors=True)
                    removed.append(p.name)
        return removed

    def load(self, version: str) -> IndexVersion:
        directory = self.path(version)
        manifest = self.manifest(version)
        candidates = json.loads((directory / "candidates.json").read_text())
        reply_index = faiss.read_index(str(directory / "replies.faiss"))
        query_index = faiss.read_index(str(directory / "queries.faiss"))
        ann.configure(reply_index, ann.AnnReport(**manifest.ann["replies"]))
        ann.configure(query_index, ann.AnnReport(**manifest.ann["queries"]))
        return IndexVersion(
            manifest=manifest,
            reply_index=reply_index,
            query_index=query_index,
            reply_ids=candidates["reply_ids"],
            reply_texts=candidates["reply_texts"],
            query_texts=candidates["query_texts"],
            query_reply_rows=np.asarray(candidates["query_reply_rows"], dtype=np.int64),
            reply_vectors=np.load(directory / "reply_vectors.npy", mmap_mode="r"),
        )
