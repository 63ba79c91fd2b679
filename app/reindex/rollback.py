"""Rollback: serve a set's version before the one its pointer names, on every replica.

It takes the same lock as a reindex job, so the two never overlap, and ends
with the same steps after the swap (tell the replicas, prune).
"""

from __future__ import annotations

import uuid

from app.reindex.reindexer import Reindexer
from app.reindex.versions import previous_version
from core.process import THIS_PROCESS


def rollback(reindexer: Reindexer) -> tuple[str, str, dict[str, str]]:
    """Serve the version before the one the pointer names (of its encoder), on every replica.
    Returns (from, to, what the steps after the swap did). LookupError: there is none, or the set
    serves no version at all."""
    runtime, target = reindexer.runtime, reindexer.candidate_set
    holding = reindexer.claim(f"rollback-{uuid.uuid4().hex[:12]}@{THIS_PROCESS}")
    try:
        runtime.current_model()  # not before the default has loaded
        # The pointer, not this replica's own copy: a replica that has not caught up
        # would otherwise roll back from the wrong version.
        current = target.store.current() or (target.serving.index_version if target.serving else None)
        if current is None:  # a conflict, not "not ready": no retry can give it a version to go back to
            raise LookupError(f"set {target.name!r} serves no index version: there is nothing to roll back to")
        # What served before it, by the pointer's history, within the set's encoder: a version of
        # another is never what "before" means.
        built_with = target.store.manifest(current).bundle_checksum
        earlier = previous_version(target.store, built_with, current)
        if earlier is None:
            raise LookupError(f"set {target.name!r}: no earlier index version built with its encoder")
        fresh = runtime.load_version(target, earlier)
        if not holding.still_held():
            raise RuntimeError("lost the reindex lock before the swap; nothing changed")
        # The pointer first, then the store goes back with it (`after_swap`): the next upload builds on
        # what is served, and a failed pointer write leaves the store as it was.
        target.point_to(fresh, "rollback", rollback=True)
        return current, earlier, reindexer.after_swap(earlier, target.store.records(earlier))
    finally:
        holding.release()
