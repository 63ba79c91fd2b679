"""Failpoints fail only the hits they are armed for, and cost nothing unarmed."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from core import failpoints


@pytest.fixture(autouse=True)
def fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(failpoints, "_armed", None)
    monkeypatch.setattr(failpoints, "_hits", failpoints.Counter())


def test_only_the_named_hits_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(failpoints.ENV, "store.pointer=2,3; other=1")
    failpoints.hit("store.pointer")
    for _ in range(2):
        with pytest.raises(OSError) as raised:
            failpoints.hit("store.pointer")
        assert raised.value.errno == errno.ENOSPC
    failpoints.hit("store.pointer")
    failpoints.hit("unnamed")


def test_unarmed_nothing_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(failpoints.ENV, raising=False)
    for _ in range(3):
        failpoints.hit("store.pointer")


def test_a_failed_pointer_write_leaves_the_pointer_where_it_was(
    monkeypatch: pytest.MonkeyPatch, artifacts: Path, tmp_path: Path
) -> None:
    import shutil

    from core.store import IndexStore

    shutil.copytree(artifacts / "indexes", tmp_path / "indexes")
    store = IndexStore(tmp_path / "indexes")
    current = store.current()
    assert current is not None
    monkeypatch.setenv(failpoints.ENV, "store.pointer=1")
    with pytest.raises(OSError):
        store.set_current(current)
    assert store.current() == current
