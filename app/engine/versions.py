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
    older = [v for v in same_model_versions(store, bundle_checksum) if v < version]
    return older[-1] if older else None


def prune(candidates: CandidateSet, keep: int = KEEP_VERSIONS) -> None:
    """Deletes all but this model's newest `keep` versions of a set, never the one the pointer names
    or this replica serves. Other models' versions are left alone: they are another bundle's index."""
    serving = candidates.current()
    spared = {serving.index_version, candidates.store.current()}
    for version in same_model_versions(candidates.store, serving.bundle.checksum)[:-keep]:
        if version not in spared:
            shutil.rmtree(candidates.store.path(version), ignore_errors=True)
