"""Which index versions there are for the loaded model, and which of them to keep.

A version is only ever removed here, and never the one the pointer names or
this replica serves.
"""

from __future__ import annotations

import shutil

from app.engine.sets import CandidateSet
from core.store import IndexStore

KEEP_VERSIONS = 3  # the serving one, the rollback target, and one more


def same_model_versions(store: IndexStore, bundle_checksum: str) -> list[str]:
    return [v for v in store.versions() if store.manifest(v).bundle_checksum == bundle_checksum]


def previous_version(store: IndexStore, bundle_checksum: str, version: str) -> str | None:
    """What a rollback from `version` serves: the version of the same model that served before it, by
    the pointer's history; for a store from before the history, the one before it by name."""
    same = lambda v: store.manifest(v).bundle_checksum == bundle_checksum  # noqa: E731
    before = store.served_before(version, same)
    if before is not None or version in store.history():
        return before
    older = [v for v in same_model_versions(store, bundle_checksum) if v < version]
    return older[-1] if older else None


def prune(candidates: CandidateSet, keep: int = KEEP_VERSIONS) -> None:
    """Deletes all but this model's newest `keep` versions of a set, never the one the pointer names,
    the one a rollback would serve, or the one this replica serves. Other models' versions are left
    alone: they are another bundle's index."""
    serving = candidates.current()
    pointer = candidates.store.current()
    target = previous_version(candidates.store, serving.bundle.checksum, pointer) if pointer else None
    spared = {serving.index_version, pointer, target}
    for version in same_model_versions(candidates.store, serving.bundle.checksum)[:-keep]:
        if version not in spared:
            shutil.rmtree(candidates.store.path(version), ignore_errors=True)
