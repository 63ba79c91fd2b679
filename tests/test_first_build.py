"""`make run` on a fresh clone: a first slice serves at once, the service builds the rest behind
it, and a build killed halfway resumes from the chunks it had encoded (#50)."""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from core.bundle import read_manifest
from core.encoder import Encoder, Side
from core.store import IndexStore
from index.__main__ import main as index_main
from index.build import KnownVectors, corpus_candidates, encode_missing, tables
from index.encode_cache import EncodeCache
from index.first_slice import MARKER, first_slice, owed
from tests.helpers import AppFactory, bundle_of

pytestmark = pytest.mark.anyio


def tiny_corpus(path: Path, conversations: int = 120) -> Path:
    """Conversations whose second turn repeats across many of them: replies that answer many contexts."""
    corpus = {
        f"conv-{i}": {
            "messages": [
                [{"text": f"hello number {i}", "sender": "u0"}],
                [{"text": ["haha yes", "oh nice", "tell me more", f"reply {i}"][i % 4], "sender": "u1"}],
                [{"text": f"and then {i} happened", "sender": "u0"}],
            ]
        }
        for i in range(conversations)
    }
    path.write_text(json.dumps(corpus))
    return path


class Counting:
    """An encoder that counts the texts it encodes, and dies after `die_after` chunks if asked."""

    def __init__(self, encoder: Encoder, die_after: int | None = None) -> None:
        self.encoder, self.die_after, self.texts, self.chunks = encoder, die_after, 0, 0
        self.dim = encoder.dim

    def encode(self, texts: list[str], side: Side) -> np.ndarray:
        if self.die_after is not None and self.chunks >= self.die_after:
            raise KeyboardInterrupt("the machine went away")
        self.chunks += 1
        self.texts += len(texts)
        return self.encoder.encode(texts, side)


def test_the_slice_is_the_replies_that_answer_the_most_contexts(tmp_path: Path) -> None:
    candidates = corpus_candidates(3, tiny_corpus(tmp_path / "corpus.json"))
    chosen = first_slice(candidates, replies=2)
    # Three replies answer a context in a quarter of the train conversations each, every other reply one.
    contexts = Counter(c.reply for c in candidates)
    assert {c.reply for c in chosen} <= {"haha yes", "oh nice", "tell me more"} and len(chosen) == 2
    left_out = [n for reply, n in contexts.items() if reply not in {c.reply for c in chosen}]
    assert min(contexts[c.reply] for c in chosen) >= max(left_out)
    assert all(c.query for c in chosen)  # each with one stored query


def test_a_build_killed_halfway_encodes_only_the_chunks_it_had_not_finished(artifacts: Path, tmp_path: Path) -> None:
    bundle_dir = bundle_of(artifacts)
    encoder = Encoder(bundle_dir, read_manifest(bundle_dir))
    t = tables(corpus_candidates(3, tiny_corpus(tmp_path / "corpus.json")))
    cache = EncodeCache(tmp_path / "cache", read_manifest(bundle_dir).checksum)
    whole = encode_missing(encoder, t, KnownVectors.empty(), chunk=8, progress=False)  # type: ignore[arg-type]

    dying = Counting(encoder, die_after=3)
    with pytest.raises(KeyboardInterrupt):
        encode_missing(dying, t, KnownVectors.empty(), chunk=8, progress=False, cache=cache)  # type: ignore[arg-type]
    again = Counting(encoder)
    resumed = encode_missing(again, t, KnownVectors.empty(), chunk=8, progress=False, cache=cache)  # type: ignore[arg-type]
    assert resumed.from_cache == 3 * 8 and again.texts == len(whole.rows) - 3 * 8
    np.testing.assert_array_equal(resumed.vectors, whole.vectors)  # the same chunks: the same vectors
    cache.forget(resumed.chunks)
    assert not cache.folder.exists()


async def test_a_first_slice_serves_at_once_and_the_full_index_replaces_it(
    make_client: AppFactory, artifacts: Path, tmp_path: Path
) -> None:
    own = tmp_path / "artifacts"
    (own / "bundles").mkdir(parents=True)
    shutil.copytree(bundle_of(artifacts), own / "bundles" / bundle_of(artifacts).name)
    corpus = tiny_corpus(tmp_path / "corpus.json")
    bundle = own / "bundles" / bundle_of(artifacts).name
    # English only: the counts below are the tiny corpus's (tests/test_korean.py builds the Korean beside it).
    args = ["--artifacts", str(own), "--bundle", str(bundle), "--corpus", str(corpus), "--if-missing", "--no-korean"]
    index_main([*args, "--first-slice", "3"])
    store = IndexStore(own / "indexes")
    debt = owed(store.root)
    assert debt is not None and store.current() == debt.slice_version
    assert store.manifest(debt.slice_version).replies == 3

    async with make_client(artifacts_dir=own, bundle_dir=bundle, encoders_dir=own / "bundles") as client:
        assert (await client.get("/readyz")).status_code == 200  # the slice serves
        assert (await client.post("/reply", json={"context": ["hello number 7"]})).status_code == 200
        info: dict[str, Any] = {}
        for _ in range(600):
            info = (await client.get("/info")).json()
            if info["first_build"]["state"] == "done":
                break
            assert info["first_build"]["state"] in ("pending", "building")
            assert (await client.post("/reply", json={"context": ["hello"]})).status_code == 200
            await asyncio.sleep(0.05)
        assert info["first_build"]["state"] == "done"
        full = {c.reply for c in corpus_candidates(3, corpus)}
        assert info["index"]["replies"] == len(full) and info["index"]["source"] == "chitchat:train"
    assert not (store.root / MARKER).exists()
    assert not (own / "cache" / "encode").exists() or not any((own / "cache" / "encode").rglob("*.npy"))
    index_main(args)  # a second `make run`: the full index is there, nothing to build
    assert store.current() == info["index"]["version"]


def test_make_index_after_a_first_slice_builds_the_full_index_at_once(artifacts: Path, tmp_path: Path) -> None:
    """`make index` (benches, the chaos suite) wants the full index: a slice owed is no reason to skip."""
    corpus = tiny_corpus(tmp_path / "corpus.json")
    args = ["--artifacts", str(tmp_path / "a"), "--bundle", str(bundle_of(artifacts)), "--corpus", str(corpus)]
    args.append("--no-korean")  # English only: the count below is the tiny corpus's
    index_main([*args, "--if-missing", "--first-slice", "3"])
    store = IndexStore(tmp_path / "a" / "indexes")
    index_main([*args, "--if-missing"])
    current = store.current()
    assert current is not None and owed(store.root) is None
    assert store.manifest(current).replies == len({c.reply for c in corpus_candidates(3, corpus)})


def test_a_service_killed_during_the_build_behind_the_slice_resumes_it_after_a_restart(
    artifacts: Path, tmp_path: Path
) -> None:
    """SIGKILL while the full build encodes, then a restart: the slice serves throughout (no 5xx while
    a process is up), the build resumes from the chunks it had written, and the full index serves."""
    import signal
    import time

    import httpx

    from bench.chaos.harness import Service, wait_for

    own = tmp_path / "artifacts"
    bundle = own / "bundles" / bundle_of(artifacts).name
    shutil.copytree(bundle_of(artifacts), bundle)
    corpus = tiny_corpus(tmp_path / "corpus.json", conversations=60_000)  # long enough to be caught mid-encode
    index_main(["--artifacts", str(own), "--bundle", str(bundle), "--corpus", str(corpus), "--first-slice", "3"])
    # At info: the resumed build says, in a log record, how many texts it took from the killed one's chunks.
    env = {
        "CHITCHAT_BUNDLE_DIR": str(bundle),
        "CHITCHAT_ENCODERS_DIR": str(own / "bundles"),
        "CHITCHAT_LOG_LEVEL": "info",
    }
    service = Service(own, None, env)
    chunks = own / "cache" / "encode"
    statuses: list[int] = []
    try:
        service.start()
        wait_for(lambda: chunks.is_dir() and len(list(chunks.rglob("*.npy"))) >= 2, 120, 0.02)
        statuses.append(httpx.post(f"{service.url}/reply", json={"context": ["hello"]}, timeout=10).status_code)
        service.signal(signal.SIGKILL)
        assert service.process is not None
        service.process.wait()
        assert owed(own / "indexes") is not None  # killed before the full version committed
        kept = len(list(chunks.rglob("*.npy")))
        service.start()  # the slice serves again at once; the build resumes behind it
        deadline = time.monotonic() + 300
        state = ""
        while time.monotonic() < deadline and state != "done":
            statuses.append(httpx.post(f"{service.url}/reply", json={"context": ["hello"]}, timeout=10).status_code)
            state = httpx.get(f"{service.url}/info", timeout=10).json()["first_build"]["state"]
            time.sleep(0.2)
        assert state == "done" and owed(own / "indexes") is None
    finally:
        service.stop()
    assert kept >= 2 and all(s == 200 for s in statuses), statuses
    log = (service.log or Path()).read_text()
    reused = [line for line in log.splitlines() if "texts from chunks an interrupted build had encoded" in line]
    assert reused, "the restarted build encoded everything again"


async def test_an_upload_that_lands_before_the_full_build_starts_wins(
    make_client: AppFactory, artifacts: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """operations.md, After a fault (the build behind a first slice): an upload that lands first drops
    the build, your candidates win. The check read this replica's serving version before the corpus
    loaded (seconds), outside the lock: an upload that landed meanwhile was replaced by the full build.
    The job now checks the pointer under the lock, as it starts and right before it swaps."""
    from app.reindex.reindexer import Reindexer
    from core.records import Candidate

    own = tmp_path / "artifacts"
    bundle = own / "bundles" / bundle_of(artifacts).name
    shutil.copytree(bundle_of(artifacts), bundle)
    corpus = tiny_corpus(tmp_path / "corpus.json")
    index_main(["--artifacts", str(own), "--bundle", str(bundle), "--corpus", str(corpus), "--first-slice", "3"])
    real_submit = Reindexer.submit

    def an_upload_lands_first(self: Reindexer, mode: str, upload: list[Candidate], *args: Any, **kwargs: Any) -> Any:
        report = args[0] if args else kwargs.get("report")
        if report and report.get("first_build"):  # between the check and the job: the upload lands
            mine = real_submit(self, "replace", [Candidate(reply="my own reply", id="mine")])
            for _ in range(600):
                if (done := self.jobs.get(mine.id)) is not None and not done.active:
                    break
                time.sleep(0.05)
        return real_submit(self, mode, upload, *args, **kwargs)

    monkeypatch.setattr(Reindexer, "submit", an_upload_lands_first)
    async with make_client(artifacts_dir=own, bundle_dir=bundle, encoders_dir=own / "bundles") as client:
        state = ""
        for _ in range(600):
            state = (await client.get("/info")).json()["first_build"]["state"]
            if state in ("done", "dropped"):
                break
            await asyncio.sleep(0.05)
        assert state == "dropped"
        answer = (await client.post("/reply", json={"context": ["hello number 7"]})).json()
        assert answer["reply"] == "my own reply" and answer["candidates"][0]["id"] == "mine"
    assert owed(own / "indexes") is None


def test_builds_sharing_the_encode_cache_never_remove_each_others_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two sets' builds with one bundle share the cache's folder. A clean-clone CI run met both races:
    one build's `forget` removing the folder between the other's check and listing (FileNotFoundError
    in `forget`), and between the other's mkdir and its write (in `put`). Each is staged here."""
    import index.encode_cache as encode_cache

    first, second = EncodeCache(tmp_path, "c" * 64), EncodeCache(tmp_path, "c" * 64)
    vectors = np.ones((1, 4), np.float32)  # [C, D]
    first.put(["a"], vectors)
    second.put(["b"], vectors)
    first.forget([["a"]])
    np.testing.assert_array_equal(second.get(["b"]), vectors)  # the other build's chunk stays
    second.forget([["b"]])
    assert not second.folder.exists()

    real_is_dir = Path.is_dir
    monkeypatch.setattr(Path, "is_dir", lambda p: True if p == first.folder else real_is_dir(p))  # seen, then gone
    first.forget([["a"]])
    monkeypatch.undo()

    real_atomic_file = encode_cache.atomic_file
    calls = []

    def removed_first(path: Path, mode: str = "w"):  # type: ignore[no-untyped-def]
        calls.append(path)
        if len(calls) == 1:
            path.parent.rmdir()  # the other build's forget, just after this one's mkdir
        return real_atomic_file(path, mode)

    monkeypatch.setattr(encode_cache, "atomic_file", removed_first)
    first.put(["a"], vectors)
    assert len(calls) == 2 and first.get(["a"]) is not None
