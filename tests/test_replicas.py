"""A replica and the version pointer: swaps only to what the pointer still names, checks the model
before reading a version's files, and never turns a name from outside into a path."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from app.engine.runtime import Runtime, build_runtime
from core.store import REPLY_INDEX, TABLES, BadVersion, IndexStore
from tests.helpers import settings_for

LATER = "v20990101T000000000000-abcdef"


@pytest.fixture
def runtime(artifacts: Path, tmp_path: Path) -> Runtime:
    copy = tmp_path / "artifacts"
    shutil.copytree(artifacts, copy)
    return build_runtime(settings_for(copy))


def copy_version(store: IndexStore, version: str, name: str, **manifest: str) -> None:
    """`version`'s files under another name, its manifest changed as given."""
    shutil.copytree(store.path(version), store.path(name))
    path = store.path(name) / "manifest.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "version": name, **manifest}))


def test_a_version_the_pointer_left_while_it_loaded_is_not_swapped_in(runtime: Runtime) -> None:
    default = runtime.default
    store = default.store
    serving = runtime.current().index_version
    copy_version(store, serving, LATER)
    loaded = runtime.load_version(default, LATER)
    assert default.behind() is None  # the pointer names what serves
    assert not default.swap_if_pointed(loaded, "test")  # ... not what was loaded
    assert runtime.current().index_version == serving
    store.set_current(LATER)
    assert default.behind() == LATER
    assert default.swap_if_pointed(loaded, "test")
    assert runtime.current().index_version == LATER and default.behind() is None


def test_another_models_version_is_refused_before_its_files_are_read(runtime: Runtime) -> None:
    store = runtime.default.store
    copy_version(store, runtime.current().index_version, LATER, bundle_checksum="0" * 64)
    (store.path(LATER) / REPLY_INDEX).unlink()  # read first, this would raise FileNotFoundError instead
    with pytest.raises(ValueError, match="another model"):
        runtime.load_version(runtime.default, LATER)


@pytest.mark.parametrize("name", ["../../etc", "/etc/passwd", "v1", "v20990101T000000000000-abcdef/..", ""])
def test_a_name_that_is_not_a_version_never_becomes_a_path(runtime: Runtime, name: str) -> None:
    with pytest.raises(BadVersion):
        runtime.default.store.path(name)
    with pytest.raises(BadVersion):
        runtime.load_version(runtime.default, name)


def test_a_pointer_naming_a_path_reads_as_no_version(runtime: Runtime) -> None:
    (runtime.default.store.root / "CURRENT").write_text("../../etc\n")
    assert runtime.default.store.current() is None


def test_another_hosts_staging_is_removed_only_once_abandoned(tmp_path: Path) -> None:
    import os

    from core.store import OWNER, STAGING_ABANDONED_S

    store = IndexStore(tmp_path / "indexes")
    building, abandoned = store.stage(), store.stage()
    for staging in (building, abandoned):
        (staging / OWNER).write_text(json.dumps({"host": "another-host", "pid": 1}))  # its pid means nothing here
    hours_ago = abandoned.stat().st_mtime - STAGING_ABANDONED_S - 60
    for path in (abandoned, *abandoned.iterdir()):
        os.utime(path, (hours_ago, hours_ago))
    assert store.remove_staging() == [abandoned.name]
    assert building.exists() and not abandoned.exists()


@pytest.mark.anyio
async def test_a_missing_sets_folder_is_not_every_set_deleted(runtime: Runtime) -> None:
    """#49, item 11: a remount that hides artifacts/sets for a poll must not drop every named set."""
    from app.engine.replicas import Follower
    from app.engine.sets import SETS_DIR, set_dir

    artifacts = runtime.settings.artifacts_dir
    (set_dir(artifacts, "kids") / "indexes").mkdir(parents=True)
    follower = Follower(runtime, poll_s=60)
    await follower.follow()
    assert "kids" in runtime.sets
    hidden = artifacts / SETS_DIR
    hidden.rename(artifacts / "sets-unmounted")
    await follower.follow()
    assert "kids" in runtime.sets  # nothing on the volume said it was deleted
    (artifacts / "sets-unmounted").rename(hidden)
    shutil.rmtree(set_dir(artifacts, "kids"))
    await follower.follow()
    assert "kids" not in runtime.sets  # a real delete still drops it


@pytest.mark.anyio
async def test_a_listing_from_before_a_delete_does_not_bring_the_set_back(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """#49, item 11: the follower lists the volume, a delete lands, then the follower adds what it listed."""
    from app.engine import replicas

    stale = ["default", "deleted"]  # listed just before `deleted`'s directory was moved away
    monkeypatch.setattr(replicas, "names_on_volume", lambda artifacts: stale)
    await replicas.Follower(runtime, poll_s=60).follow()
    assert "deleted" not in runtime.sets


def _named_set_copy(runtime: Runtime, name: str) -> IndexStore:
    """Set `name` on the volume, its pointer naming a copy of the default set's version."""
    from app.engine.sets import set_dir

    store = IndexStore(set_dir(runtime.settings.artifacts_dir, name) / "indexes")
    version = runtime.current().index_version
    shutil.copytree(runtime.default.store.path(version), store.path(version))
    store.set_current(version)
    return store


@pytest.mark.parametrize(
    "damage",
    [
        lambda d: (d / REPLY_INDEX).write_bytes(b"not a faiss index"),  # RuntimeError from faiss
        lambda d: (d / TABLES).write_bytes((d / TABLES).read_bytes()[:40]),  # a cut gzip: EOFError
    ],
)
def test_one_unreadable_version_fails_its_set_alone_at_startup(artifacts: Path, tmp_path: Path, damage: object) -> None:
    """#49, item 3: a corrupt version used to stop startup, the default set included."""
    copy = tmp_path / "artifacts"
    shutil.copytree(artifacts, copy)
    runtime = build_runtime(settings_for(copy))
    broken = _named_set_copy(runtime, "broken")
    damage(broken.path(broken.current() or ""))  # type: ignore[operator]
    restarted = build_runtime(settings_for(copy))
    assert restarted.current().index_version  # the default set serves
    assert restarted.sets["broken"].serving is None and restarted.sets["broken"].problem


@pytest.mark.anyio
async def test_the_follower_passes_a_bad_set_and_tries_it_again(runtime: Runtime) -> None:
    """#49, item 3: a set whose version cannot be read stalled every set after it, and was never retried."""
    from app.engine import replicas

    bad, good = _named_set_copy(runtime, "aaa-bad"), _named_set_copy(runtime, "zzz-good")
    version = bad.current() or ""
    (bad.path(version) / REPLY_INDEX).rename(bad.path(version) / "reply.moved")  # a transient read error
    follower = replicas.Follower(runtime, poll_s=60)
    await follower.follow()
    assert runtime.sets["zzz-good"].serving is not None  # listed after the bad one, still followed
    assert runtime.sets["aaa-bad"].serving is None
    (bad.path(version) / "reply.moved").rename(bad.path(version) / REPLY_INDEX)  # the volume recovers
    await follower.follow()
    assert runtime.sets["aaa-bad"].serving is None  # not every poll: it waits before trying again
    follower._refused = {k: (0.0, wait) for k, (_, wait) in follower._refused.items()}  # the wait is over
    await follower.follow()
    assert runtime.sets["aaa-bad"].serving is not None and good.current() is not None
