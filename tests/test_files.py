"""core/files.py: a file others read is replaced whole, or not at all."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from core.files import atomic_file, staged_dir, write_atomic, write_json_atomic


def test_the_target_is_replaced_whole(tmp_path: Path) -> None:
    target = tmp_path / "CURRENT"
    target.write_text("a much longer old content than the new one\n")
    write_atomic(target, "v2\n")
    assert target.read_text() == "v2\n"
    write_atomic(target, b"\x00\x01", sync_dir=True)
    assert target.read_bytes() == b"\x00\x01"
    assert [p.name for p in tmp_path.iterdir()] == ["CURRENT"]


def test_a_new_file_gets_the_permissions_a_plain_write_would(tmp_path: Path) -> None:
    plain, atomic = tmp_path / "plain", tmp_path / "atomic"
    plain.write_text("x")
    write_atomic(atomic, "x")
    assert atomic.stat().st_mode == plain.stat().st_mode


def test_json_is_written_as_read_back(tmp_path: Path) -> None:
    target = tmp_path / "manifest.json"
    write_json_atomic(target, {"name": "대화", "n": 1}, indent=2)
    assert json.loads(target.read_text(encoding="utf-8")) == {"name": "대화", "n": 1}
    assert target.read_text(encoding="utf-8").endswith("}\n") and "대화" in target.read_text(encoding="utf-8")


def test_a_failing_write_leaves_the_old_file_and_no_temporary_one(tmp_path: Path) -> None:
    target = tmp_path / "candidates.jsonl"
    target.write_text("old\n")
    with pytest.raises(RuntimeError), atomic_file(target) as f:
        f.write("half of the ")
        raise RuntimeError("disk full")
    assert target.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["candidates.jsonl"]


def test_a_failing_first_write_creates_nothing(tmp_path: Path) -> None:
    target = tmp_path / "job.json"
    with pytest.raises(TypeError):
        write_atomic(target, 3)  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []


def test_concurrent_writers_never_share_a_temporary_file(tmp_path: Path) -> None:
    target = tmp_path / "CURRENT"
    texts = [f"v{i}\n" * 1000 for i in range(8)]
    threads = [threading.Thread(target=write_atomic, args=(target, t)) for t in texts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert target.read_text() in texts
    assert [p.name for p in tmp_path.iterdir()] == ["CURRENT"]


def test_a_staged_directory_replaces_the_old_one_whole_or_not_at_all(tmp_path: Path) -> None:
    final = tmp_path / "bundle"
    final.mkdir()
    (final / "old.txt").write_text("old")
    with pytest.raises(RuntimeError), staged_dir(final) as staging:
        (staging / "new.txt").write_text("half")
        raise RuntimeError("the export failed")
    assert [p.name for p in tmp_path.iterdir()] == ["bundle"]  # no staging left behind
    assert [p.name for p in final.iterdir()] == ["old.txt"]
    with staged_dir(final) as staging:
        (staging / "new.txt").write_text("new")
    assert [p.name for p in tmp_path.iterdir()] == ["bundle"]  # nor the old one, moved aside
    assert [p.name for p in final.iterdir()] == ["new.txt"] and final.stat().st_mode & 0o755 == 0o755
