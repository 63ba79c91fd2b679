"""Named candidate sets: several bots' replies in one service, each with its own
index versions, pointer, reindex jobs and rollback; the model is shared.

    artifacts/indexes/           the set "default", where it has always been
    artifacts/sets/<name>/       every other set
      indexes/                   its versions and CURRENT pointer (core/store.py)
      candidates.jsonl, jobs/    its candidate store and jobs, without Redis

A set exists while its directory does: every replica finds the sets on the
shared volume (`replicas.Follower`), and a deleted set's directory is renamed
away in one step before it is removed. A name becomes a path only once it
matches SET_NAME.
"""

from __future__ import annotations

import fcntl
import logging
import re
import shutil
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from core.retriever import Serving
from core.store import IndexStore

log = logging.getLogger(__name__)

DEFAULT_SET = "default"
SETS_DIR = "sets"
# Lowercase so that two names never collide on a case-insensitive volume; 32 characters at most.
SET_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,31}")
DELETED_PREFIX = ".deleted-"  # a set's directory renamed away, before it is removed


class NotReady(Exception):
    """Nothing to serve yet: the model or a set's first index version is still loading, or missing."""


class NoSuchSet(LookupError):
    """A request or admin call named a set this service does not have."""

    def __init__(self, name: str) -> None:
        super().__init__(f"no candidate set {name!r}")
        self.field = "set"


class BadSetName(ValueError):
    def __init__(self, name: str) -> None:
        super().__init__(f"not a set name: {name[:40]!r} (1-32 of a-z, 0-9, _ and -, starting with a letter or digit)")
        self.field = "set"


def check_set_name(name: str) -> str:
    if not SET_NAME.fullmatch(name):
        raise BadSetName(name)
    return name


def set_dir(artifacts: Path, name: str) -> Path:
    """Where a named set keeps its files (not the default set: it lives at the artifacts root)."""
    return artifacts / SETS_DIR / check_set_name(name)


def indexes_root(artifacts: Path, name: str) -> Path:
    return artifacts / "indexes" if name == DEFAULT_SET else set_dir(artifacts, name) / "indexes"


def names_on_volume(artifacts: Path) -> list[str] | None:
    """The named sets whose directories exist, sorted, after the default set, which always exists.
    None when there is no sets folder to read: no named set was ever made, or the volume is not
    there (a remount); either way nothing on it says a set was deleted."""
    root = artifacts / SETS_DIR
    if not root.is_dir():
        return None
    found = [p.name for p in root.iterdir() if p.is_dir() and SET_NAME.fullmatch(p.name)]
    return [DEFAULT_SET, *sorted(n for n in found if n != DEFAULT_SET)]


@contextmanager
def creating(artifacts: Path) -> Iterator[None]:
    """Held while a new set is counted and made: an exclusive lock on a file on the shared volume, so
    two replicas (or a set another replica made that this one has not discovered yet) cannot both pass
    the limit on sets."""
    artifacts.mkdir(parents=True, exist_ok=True)
    with (artifacts / f"{SETS_DIR}.lock").open("a") as f:  # beside the sets: nothing in there is not a set
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def stored_candidates(artifacts: Path, name: str) -> int:
    """The candidate records the version set `name`'s pointer names was built from, read from the
    volume: every replica sees it, whether or not it has loaded the set. Records, as an upload is
    counted: a reply stored once with two queries is two candidates."""
    store = IndexStore(indexes_root(artifacts, name))
    try:
        version = store.current()
        return store.record_count(version) if version else 0
    except (OSError, ValueError):
        return 0


def holds_a_version(artifacts: Path, name: str) -> bool:
    return bool(IndexStore(indexes_root(artifacts, name)).versions())


def on_volume(artifacts: Path, name: str) -> bool:
    return name == DEFAULT_SET or set_dir(artifacts, name).is_dir()


def move_set_dir_away(artifacts: Path, name: str) -> Path | None:
    """Renames the set's directory away, in one step: no replica sees half a set. Returns where it went
    (`remove_moved` removes it), or None if there was none."""
    directory = set_dir(artifacts, name)
    if not directory.is_dir():
        return None
    gone = directory.with_name(f"{DELETED_PREFIX}{name}-{uuid.uuid4().hex[:8]}")
    directory.rename(gone)
    return gone


def remove_moved(gone: Path | None) -> None:
    if gone is not None:
        shutil.rmtree(gone, ignore_errors=True)


@dataclass
class CandidateSet:
    """One set's index versions and the version this replica serves from it.

    `serving` is the one reference to the current (model, index version)
    pair; replacing it is a single assignment, so a request that read it keeps
    its snapshot to the end while later requests see the new one."""

    name: str
    store: IndexStore
    serving: Serving | None = None
    problem: str | None = None  # why serving is None, for /readyz and the 503
    # Held while the pointer file and `serving` are compared or changed together: a replica
    # following the pointer never swaps to a version that another swap here has replaced.
    swap_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def current(self) -> Serving:
        serving = self.serving
        if serving is None:
            raise NotReady(self.problem or f"set {self.name!r}: still loading")
        return serving

    def point_to(self, serving: Serving, why: str, rollback: bool = False) -> None:
        """Makes `serving`'s version the one every replica serves (the pointer file), and serves it here.
        `rollback`: a return to what served before (the pointer's history is unwound, not extended)."""
        with self.swap_lock:
            self.store.set_current(serving.index_version, rollback=rollback)
            self.swap(serving, why)

    def behind(self) -> str | None:
        """The pointer's version if this replica serves another, else None."""
        with self.swap_lock:
            pointer = self.store.current()
            serving = self.serving
            return pointer if pointer is not None and (serving is None or serving.index_version != pointer) else None

    def swap_if_pointed(self, serving: Serving, why: str) -> bool:
        """Swaps only if the pointer still names `serving`'s version: it may have moved on while it loaded."""
        with self.swap_lock:
            if self.store.current() != serving.index_version:
                return False
            self.swap(serving, why)
            return True

    def swap(self, serving: Serving, why: str) -> Serving | None:
        """Serve `serving` from the next request on; returns what served before. The one place a
        set's snapshot changes."""
        before, self.serving = self.serving, serving
        self.problem = None
        log.info(
            "set %s: now serving bundle %s with index %s (%s; was %s)",
            self.name,
            serving.bundle.name,
            serving.index_version,
            why,
            before.index_version if before else "nothing",
        )
        return before
