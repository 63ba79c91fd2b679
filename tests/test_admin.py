"""Admin: auth, uploads, zero-downtime reindex, rollback, crash recovery, replicas."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import AsyncIterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import redis

from app.reindex.jobs import FileJobStore, Job, RedisLock
from core import encoder as encoder_module
from core.store import OWNER, IndexStore
from tests.helpers import AUTH, REDIS_URL, TOKEN, AppFactory, loaded, upload, wait_for

pytestmark = pytest.mark.anyio


@pytest.fixture
def own_artifacts(artifacts: Path, tmp_path: Path) -> Path:
    """A private copy: these tests write versions, pointers and stores."""
    copy = tmp_path / "artifacts"
    shutil.copytree(artifacts, copy)
    return copy


@pytest.fixture
async def admin_client(make_client: AppFactory, own_artifacts: Path) -> AsyncIterator[httpx.AsyncClient]:
    async with make_client(artifacts_dir=own_artifacts, admin_token=TOKEN) as client:
        yield client


async def version_of(client: httpx.AsyncClient) -> str:
    return str((await client.get("/readyz")).json()["index_version"])


async def subscribed(redis_client: redis.Redis, listeners: int) -> None:
    """Returns once `listeners` replicas listen for index updates: a message sent before would be lost."""
    from app.engine.replicas import CHANNEL

    for _ in range(1000):
        if dict(redis_client.pubsub_numsub(CHANNEL)).get(CHANNEL.encode(), 0) >= listeners:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"fewer than {listeners} replicas subscribed to {CHANNEL}")


ADMIN_CALLS = [
    ("POST", "/admin/candidates", [{"reply": "hi"}]),
    ("POST", "/admin/candidates/delete", [{"id": "x"}]),
    ("GET", "/admin/jobs/abc", None),
    ("GET", "/admin/index", None),
    ("POST", "/admin/rollback", None),
]


@pytest.mark.parametrize(("method", "path", "body"), ADMIN_CALLS)
async def test_admin_is_disabled_without_a_configured_token(
    client: httpx.AsyncClient, method: str, path: str, body: Any
) -> None:
    """candidates.md, Admin: disabled unless CHITCHAT_ADMIN_TOKEN is set."""
    response = await client.request(method, path, json=body, headers=AUTH)
    assert response.status_code == 401
    assert response.json()["error"]["kind"] == "unauthorized"


@pytest.mark.parametrize(("method", "path", "body"), ADMIN_CALLS)
@pytest.mark.parametrize("header", [{}, {"authorization": "Bearer wrong"}, {"authorization": TOKEN}])
async def test_every_admin_route_needs_the_token(
    admin_client: httpx.AsyncClient, method: str, path: str, body: Any, header: dict[str, str]
) -> None:
    """candidates.md, Admin: every admin route needs `Authorization: Bearer <token>` (401 `unauthorized`)."""
    response = await admin_client.request(method, path, json=body, headers=header)
    assert response.status_code == 401
    assert response.json()["error"]["field"] == "authorization"


async def test_append_reindexes_and_the_new_candidate_answers(admin_client: httpx.AsyncClient) -> None:
    """candidates.md, Admin: an upload is 202 with a job; the new version is built to the side,
    swapped in, and `GET /admin/index` names it and the one before."""
    before = await version_of(admin_client)
    job = await upload(admin_client, [{"query": "do you like tacos?", "reply": "tacos are life", "id": "taco-1"}])
    assert job["state"] == "succeeded", job
    assert job["previous_version"] == before and job["version"] != before
    assert job["counts"]["uploaded"] == 1 and job["counts"]["encoded"] <= 2  # the rest were reused
    assert await version_of(admin_client) == job["version"]

    body = (await admin_client.post("/reply", json={"context": ["do you like tacos?"]})).json()
    assert body["reply"] == "tacos are life" and body["id"] == "taco-1"
    assert body["index_version"] == job["version"]
    # Appending kept what was served before.
    assert (await admin_client.post("/reply", json={"context": ["my cat is sick"]})).json()["reply"] == (
        "oh no, i hope she gets better soon"
    )
    info = (await admin_client.get("/admin/index", headers=AUTH)).json()
    assert info["current"] == job["version"] and info["previous"] == before


async def test_a_reindex_loads_no_tokenizer_of_its_own(
    admin_client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Loading one holds the GIL (~1 s for e5's 250k pieces): the job borrows the served model's."""
    loads: list[Path] = []
    real = encoder_module._tokenizer
    monkeypatch.setattr(encoder_module, "_tokenizer", lambda path, *a, **k: loads.append(path) or real(path, *a, **k))
    job = await upload(admin_client, [{"query": "do you like soup?", "reply": "soup is a meal", "id": "soup-1"}])
    assert job["state"] == "succeeded", job
    assert job["counts"]["encoded"] >= 1 and loads == []


async def test_ndjson_delete_and_replace(admin_client: httpx.AsyncClient) -> None:
    """candidates.md, Bring your own replies: NDJSON; `append` adds or replaces by id, `replace`
    swaps the whole set, `delete` removes the ids listed."""
    lines = b'{"reply": "bananas!", "query": "favourite fruit?", "id": "fruit"}\n\n{"reply": "kiwi", "id": "k"}\n'
    response = await admin_client.post(
        "/admin/candidates", content=lines, headers={**AUTH, "content-type": "application/x-ndjson"}
    )
    assert (await wait_for(admin_client, response.json()["job_id"]))["state"] == "succeeded"
    assert (await admin_client.post("/reply", json={"context": ["favourite fruit?"]})).json()["reply"] == "bananas!"

    assert (await upload(admin_client, [{"id": "fruit"}], mode="delete"))["state"] == "succeeded"
    body = (await admin_client.post("/reply", json={"context": ["favourite fruit?"], "k": 50})).json()
    assert "bananas!" not in [c["text"] for c in body["candidates"]]

    job = await upload(admin_client, [{"reply": "only this", "query": "anything"}], mode="replace")
    assert job["counts"]["candidates_after"] == 1
    body = (await admin_client.post("/reply", json={"context": ["my cat is sick"], "k": 50})).json()
    assert [c["text"] for c in body["candidates"]] == ["only this"]


BAD_UPLOADS: list[tuple[str, bytes, str, int, str]] = [
    ("not json", b"{nope", "application/json", 422, "body"),
    ("not a list", b'{"reply": "x"}', "application/json", 422, "body"),
    ("empty list", b"[]", "application/json", 422, "records"),
    ("empty reply", b'[{"reply": "ok"}, {"reply": ""}]', "application/json", 422, "record 2.reply"),
    ("blank reply", b'[{"reply": "  "}]', "application/json", 422, "record 1.reply"),
    ("missing reply", b'[{"query": "q"}]', "application/json", 422, "record 1.reply"),
    ("unknown field", b'[{"reply": "a", "score": 1}]', "application/json", 422, "record 1.score"),
    ("bad id", b'[{"reply": "a", "id": "has space"}]', "application/json", 422, "record 1.id"),
    ("bad ndjson line", b'{"reply": "a"}\n{oops\n', "application/x-ndjson", 422, "line 2"),
    ("reply too long", json.dumps([{"reply": "a" * 1001}]).encode(), "application/json", 422, "record 1.reply"),
    ("NUL in a reply", json.dumps([{"reply": "a\u0000b"}]).encode(), "application/json", 422, "record 1.reply"),
    ("csv without a reply column", b"question,answer\nq,a\n", "text/csv", 422, "body"),
    ("csv with a blank reply", "query,reply\nhi,hello\nhey,\u00a0\n".encode(), "text/csv", 422, "line 3.reply"),
    # Not the reply "hello" with the rest dropped.
    ("csv with an unquoted comma", b"query,reply\nhi there,hello, how are you today\n", "text/csv", 422, "line 2"),
    ("csv repeating a column", b"query,reply,reply\nhi,hello,hey\n", "text/csv", 422, "body"),
    (
        "metadata too deep",
        json.dumps([{"reply": "a", "metadata": {"k": {"nested": 1}}}]).encode(),
        "application/json",
        422,
        "record 1.metadata.k",
    ),
]


@pytest.mark.parametrize(
    ("case", "body", "content_type", "status", "field"), BAD_UPLOADS, ids=[b[0] for b in BAD_UPLOADS]
)
async def test_bad_uploads_name_the_line_and_leave_the_old_version_serving(
    admin_client: httpx.AsyncClient, case: str, body: bytes, content_type: str, status: int, field: str
) -> None:
    """candidates.md, Bring your own replies: by default one invalid record refuses the whole upload
    and names it (`line 326.reply`); the version before keeps serving."""
    before = await version_of(admin_client)
    response = await admin_client.post(
        "/admin/candidates", content=body, headers={**AUTH, "content-type": content_type}
    )
    assert response.status_code == status, response.text
    assert response.json()["error"]["field"] == field
    assert await version_of(admin_client) == before


async def test_oversize_uploads_and_record_counts_are_refused(make_client: AppFactory, own_artifacts: Path) -> None:
    """operations.md, Configuration, and api.md, Errors and limits: an upload body past
    CHITCHAT_ADMIN_MAX_BODY_BYTES is 413 `payload_too_large` naming `body`, a chunked one (no length)
    included; past CHITCHAT_ADMIN_MAX_RECORDS records, 413 naming `records`. Nothing changes."""

    async def chunked() -> AsyncIterator[bytes]:
        for _ in range(3):
            yield b'[{"reply": "' + b"x" * 900 + b'"},'

    async with make_client(
        artifacts_dir=own_artifacts, admin_token=TOKEN, admin_max_body_bytes=2048, admin_max_records=3
    ) as client:
        before = await version_of(client)
        big = await client.post("/admin/candidates", json=[{"reply": "x" * 900}] * 3, headers=AUTH)
        assert big.status_code == 413 and big.json()["error"]["kind"] == "payload_too_large"
        unsized = await client.post("/admin/candidates", content=chunked(), headers=AUTH)
        assert unsized.status_code == 413 and unsized.json()["error"]["field"] == "body", unsized.text
        many = await client.post("/admin/candidates", json=[{"reply": "x"}] * 4, headers=AUTH)
        assert many.status_code == 413 and many.json()["error"]["field"] == "records"
        assert await version_of(client) == before


async def test_delete_everything_is_refused_and_nothing_changes(admin_client: httpx.AsyncClient) -> None:
    before = await version_of(admin_client)
    job = await upload(admin_client, [{"reply": "only", "id": "only"}], mode="replace")
    job = await upload(admin_client, [{"id": "only"}], mode="delete")
    assert job["state"] == "failed" and "no candidates" in job["error"]
    assert await version_of(admin_client) != before  # the replace took effect; the delete did not
    assert (await admin_client.post("/reply", json={"context": ["hello"]})).json()["reply"] == "only"


async def test_a_second_reindex_while_one_runs_is_409(
    make_client: AppFactory, own_artifacts: Path, clean_redis: redis.Redis
) -> None:
    """api.md, Errors and limits: `conflict` 409 while a reindex or rollback runs, on any
    replica (Scale-out: the lock is in Redis)."""
    async with make_client(artifacts_dir=own_artifacts, admin_token=TOKEN, redis_url=REDIS_URL) as client:
        assert RedisLock(clean_redis).acquire("another-replica")  # as if another replica were reindexing
        response = await client.post("/admin/candidates", json=[{"reply": "x"}], headers=AUTH)
        assert response.status_code == 409 and response.json()["error"]["kind"] == "conflict"
        assert (await client.post("/admin/rollback", headers=AUTH)).status_code == 409


async def test_a_rollback_after_an_upload_serves_what_served_before_it(admin_client: httpx.AsyncClient) -> None:
    """#49, item 5: roll back v3 -> v2, upload (v4), roll back again: v2 serves, what served before v4,
    not v3 (the version before v4 by name), the very version the operator rolled back from."""
    await upload(admin_client, [{"reply": "two", "id": "two"}])
    v2 = await version_of(admin_client)
    v3 = (await upload(admin_client, [{"reply": "three", "id": "three"}]))["version"]
    first = (await admin_client.post("/admin/rollback", headers=AUTH)).json()
    assert (first["from"], first["to"]) == (v3, v2)
    v4 = (await upload(admin_client, [{"reply": "four", "id": "four"}]))["version"]
    second = (await admin_client.post("/admin/rollback", headers=AUTH)).json()
    assert (second["from"], second["to"]) == (v4, v2) and await version_of(admin_client) == v2
    index = (await admin_client.get("/admin/index", headers=AUTH)).json()
    assert index["current"] == v2 and index["previous"] != v3


async def test_a_store_from_before_the_history_rolls_back_its_first_upload(
    make_client: AppFactory, own_artifacts: Path
) -> None:
    """A pointer with no HISTORY file beside it (a store written before there was one): the first
    upload's history starts with the version the pointer named, so a rollback has somewhere to go."""
    (own_artifacts / "indexes" / "HISTORY").unlink()
    async with make_client(artifacts_dir=own_artifacts, admin_token=TOKEN) as client:
        first = await version_of(client)
        job = await upload(client, [{"reply": "after the upgrade", "id": "upgrade"}])
        rolled = (await client.post("/admin/rollback", headers=AUTH)).json()
        assert (rolled["from"], rolled["to"]) == (job["version"], first) and await version_of(client) == first


async def test_rollback_serves_the_previous_version(admin_client: httpx.AsyncClient) -> None:
    """candidates.md, Admin: `POST /admin/rollback` serves the previous version, and the candidate
    store goes back with it; with nothing older, 409."""
    first = await version_of(admin_client)
    job = await upload(admin_client, [{"reply": "new!", "query": "what's new?"}])
    response = await admin_client.post("/admin/rollback", headers=AUTH)
    assert response.json() == {
        "set": "default",
        "from": job["version"],
        "to": first,
        "after_swap": {"store": "done", "publish": "done", "prune": "done"},
    }
    assert await version_of(admin_client) == first
    assert (await admin_client.post("/admin/rollback", headers=AUTH)).status_code == 409  # nothing older
    # The candidate store went back too: the next upload builds on what is served, not on what was rolled back.
    again = await upload(admin_client, [{"reply": "newer", "query": "and now?"}])
    assert again["counts"]["candidates_after"] == job["counts"]["candidates_before"] + 1
    texts = [
        c["text"]
        for c in (await admin_client.post("/reply", json={"context": ["what's new?"], "k": 50})).json()["candidates"]
    ]
    assert "new!" not in texts


async def test_a_crash_mid_build_leaves_the_current_version_and_fails_the_job(
    make_client: AppFactory, own_artifacts: Path
) -> None:
    """candidates.md, Admin: a crash mid-build leaves the current version serving; the job is marked
    failed by the next start. Scale-out: staging directories whose process is gone are removed."""
    store = IndexStore(own_artifacts / "indexes")
    serving = store.current()
    staging = store.stage()  # what a build that died halfway leaves behind ...
    (staging / "replies.faiss").write_bytes(b"partial")
    (staging / OWNER).write_text(json.dumps({"host": socket.gethostname(), "pid": dead_pid()}))  # ... its process gone
    live = store.stage()  # and one this process (another replica, say) is still writing
    FileJobStore(own_artifacts / "jobs").save(Job(id="deadbeef", mode="append", state="running", stage="encode"))

    async with make_client(artifacts_dir=own_artifacts, admin_token=TOKEN) as client:
        assert await version_of(client) == serving
        job = (await client.get("/admin/jobs/deadbeef", headers=AUTH)).json()
        assert job["state"] == "failed" and "interrupted" in job["error"]
    assert not staging.exists()
    assert live.exists()


def dead_pid() -> int:
    """The pid of a process that has exited."""
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


async def test_a_deeply_nested_upload_is_a_422_naming_the_line(admin_client: httpx.AsyncClient) -> None:
    nested = b"[" * 5000 + b"]" * 5000
    ndjson = b'{"reply": "fine"}\n' + nested + b"\n"
    response = await admin_client.post(
        "/admin/candidates", content=ndjson, headers={**AUTH, "content-type": "application/x-ndjson"}
    )
    assert response.status_code == 422, response.text
    assert response.json()["error"]["field"] == "line 2"
    response = await admin_client.post(
        "/admin/candidates", content=nested, headers={**AUTH, "content-type": "application/json"}
    )
    assert response.status_code == 422 and response.json()["error"]["field"] == "body", response.text


async def test_reindex_under_load_never_errors_and_each_reply_has_one_version(admin_client: httpx.AsyncClient) -> None:
    """candidates.md, Admin: zero-downtime swap; requests in flight finish on the version they
    started with."""
    old = await version_of(admin_client)
    seen: list[tuple[str, str]] = []
    errors: list[str] = []
    done = asyncio.Event()

    async def load() -> None:
        while not done.is_set():
            response = await admin_client.post("/reply", json={"context": ["do you like tacos?"]})
            if response.status_code != 200:
                errors.append(response.text)
            else:
                body = response.json()
                seen.append((body["index_version"], body["reply"]))

    clients = [asyncio.create_task(load()) for _ in range(4)]
    records = [{"reply": f"candidate number {i}", "query": f"synthetic question {i}"} for i in range(2000)]
    records.append({"reply": "tacos are life", "query": "do you like tacos?"})
    job = await upload(admin_client, records)
    await asyncio.sleep(0.2)
    done.set()
    await asyncio.gather(*clients)

    assert job["state"] == "succeeded", job
    assert errors == []
    assert {v for v, _ in seen} <= {old, job["version"]}
    assert {v for v, _ in seen} == {old, job["version"]}, "the load did not span the swap"
    after = [reply for v, reply in seen if v == job["version"]]
    assert after and all(reply == "tacos are life" for reply in after)


async def test_two_replicas_converge_on_the_new_version(
    make_client: AppFactory, own_artifacts: Path, clean_redis: redis.Redis
) -> None:
    settings = {"artifacts_dir": own_artifacts, "admin_token": TOKEN, "redis_url": REDIS_URL}
    async with make_client(**settings) as replica_a, make_client(**settings) as replica_b:
        await subscribed(clean_redis, 2)
        job = await upload(replica_a, [{"reply": "seen everywhere", "query": "are you in sync?"}])
        assert job["state"] == "succeeded"
        for _ in range(100):
            if await version_of(replica_b) == job["version"]:
                break
            await asyncio.sleep(0.05)
        assert await version_of(replica_b) == job["version"] == await version_of(replica_a)
        body = (await replica_b.post("/reply", json={"context": ["are you in sync?"]})).json()
        assert body["reply"] == "seen everywhere"
        # The candidate store is shared: B's view of it includes A's upload.
        assert (await replica_b.get("/admin/index", headers=AUTH)).json()["stored_candidates"] > 1


async def test_skip_indexes_the_valid_records_and_reports_the_rest(admin_client: httpx.AsyncClient) -> None:
    """candidates.md, Bring your own replies: `on_invalid=skip` indexes the valid records and reports
    each skipped one (line, field, reason)."""
    lines = [
        {"query": "what is your favourite tree?", "reply": "an old oak, no question", "id": "oak"},
        {"reply": "x" * 1001, "id": "too-long"},  # never truncated: skipped and reported
        {"query": "are you a night owl?", "reply": "totally, 2am is my time"},
        {"reply": "\u200b"},
        {"reply": "an old oak, no question", "id": "oak-again"},  # the same text under another id
    ]
    body = "".join(json.dumps(line) + "\n" for line in lines).encode()
    rejected = await admin_client.post(
        "/admin/candidates", content=body, headers={**AUTH, "content-type": "application/x-ndjson"}
    )
    assert rejected.status_code == 422 and rejected.json()["error"]["field"] == "line 2.reply"
    assert "on_invalid=skip" in rejected.json()["error"]["message"]

    response = await admin_client.post(
        "/admin/candidates?on_invalid=skip", content=body, headers={**AUTH, "content-type": "application/x-ndjson"}
    )
    assert response.status_code == 202 and response.json()["records"] == 3 and response.json()["skipped"] == 2
    job = await wait_for(admin_client, response.json()["job_id"])
    assert job["state"] == "succeeded", job
    report = job["report"]
    assert report["skipped"] == 2
    assert [(r["line"], r["field"]) for r in report["skipped_records"]] == [(2, "line 2.reply"), (4, "line 4.reply")]
    assert "1000" in report["skipped_records"][0]["reason"]
    assert report["duplicates"]["texts"]["records"] == 1 and "first id" in report["duplicates"]["texts"]["rule"]
    assert report["duplicates"]["texts"]["lines"] == [5]
    answer = (await admin_client.post("/reply", json={"context": ["what is your favourite tree?"]})).json()
    assert answer["reply"] == "an old oak, no question" and answer["id"] == "oak"


async def test_csv_uploads_and_duplicate_ids_resolve_to_the_last_record(admin_client: httpx.AsyncClient) -> None:
    """candidates.md, Bring your own replies: CSV with a header; the same id twice keeps the last
    record, reported with its rule."""
    body = (
        b"query,reply,id\n"
        b'"so, do you like spicy food?","yes, the hotter the better",spicy\n'
        b'anything else?,"nope, that\'s all",done\n'
        b'"so, do you like spicy food?","no, mild please",spicy\n'
    )
    response = await admin_client.post("/admin/candidates", content=body, headers={**AUTH, "content-type": "text/csv"})
    assert response.status_code == 202, response.text
    job = await wait_for(admin_client, response.json()["job_id"])
    assert job["state"] == "succeeded", job
    # Line 2 gave way to line 4.
    assert job["report"]["duplicates"]["ids"] == {**job["report"]["duplicates"]["ids"], "records": 1, "lines": [2]}
    assert "last record wins" in job["report"]["duplicates"]["ids"]["rule"]
    answer = (await admin_client.post("/reply", json={"context": ["so, do you like spicy food?"]})).json()
    assert answer["reply"] == "no, mild please" and answer["id"] == "spicy"


async def test_appending_what_is_stored_reports_it_as_a_duplicate(admin_client: httpx.AsyncClient) -> None:
    lines = [
        {"reply": "Pizza,  no CONTEST", "id": "pizza"},  # a stored reply's text under a new id
        {"query": "what's your favourite food?", "reply": "pizza, no contest"},  # the stored record itself
        {"reply": "brand new, never seen"},
        {"reply": "brand new, never seen", "id": "again"},
    ]
    body = "".join(json.dumps(line) + "\n\n" for line in lines).encode()  # blank lines between: 1, 3, 5, 7
    response = await admin_client.post(
        "/admin/candidates", content=body, headers={**AUTH, "content-type": "application/x-ndjson"}
    )
    job = await wait_for(admin_client, response.json()["job_id"])
    assert job["state"] == "succeeded", job
    found = {name: (d["records"], d["lines"]) for name, d in job["report"]["duplicates"].items()}
    # Line 3 has the stored id and the stored text: one replacement, not also a repeated text.
    assert found == {"ids": (0, []), "stored_ids": (1, [3]), "texts": (1, [7]), "stored_texts": (1, [1])}
    rules = {name: d["rule"] for name, d in job["report"]["duplicates"].items()}
    assert "the upload replaces the stored record" in rules["stored_ids"]
    assert "the stored record's id wins" in rules["stored_texts"]
    assert "record_lines" not in job["report"]  # handed over, not stored with the job
    answer = (await admin_client.post("/reply", json={"context": ["what's your favourite food?"]})).json()
    assert answer["reply"] == "pizza, no contest" and answer["id"] != "pizza"


async def test_delete_by_record_removes_the_candidate_it_names(admin_client: httpx.AsyncClient) -> None:
    record = {"query": "what's your favourite colour?", "reply": "teal, obviously"}
    await upload(admin_client, [record])
    assert (await admin_client.post("/reply", json={"context": [record["query"]]})).json()["reply"] == record["reply"]
    job = await upload(admin_client, [record], mode="delete")
    assert job["state"] == "succeeded" and job["counts"]["candidates_after"] == job["counts"]["candidates_before"] - 1
    texts = [
        c["text"]
        for c in (await admin_client.post("/reply", json={"context": [record["query"]], "k": 50})).json()["candidates"]
    ]
    assert record["reply"] not in texts


async def test_a_deployment_without_an_index_serves_after_its_first_upload(
    make_client: AppFactory, artifacts: Path, tmp_path: Path
) -> None:
    # The model only: no index version yet, as a deployment that brings its own candidates starts.
    """candidates.md, Bring your own replies: without an index `/readyz` is 503, and the first upload
    builds the first version."""
    async with make_client(artifacts_dir=tmp_path / "fresh", admin_token=TOKEN) as client:
        ready = await client.get("/readyz")
        assert ready.status_code == 503 and "upload candidates" in ready.json()["problem"]
        assert (await client.post("/reply", json={"context": ["안녕"]})).status_code == 503
        records = [{"query": "안녕하세요", "reply": "반가워요!"}, {"query": "뭐 해?", "reply": "그냥 쉬고 있어"}]
        job = await upload(client, records, mode="replace")
        assert job["state"] == "succeeded" and job["previous_version"] is None, job
        assert (await client.get("/readyz")).status_code == 200
        answer = (await client.post("/reply", json={"context": ["안녕하세요"]})).json()
        assert answer["reply"] == "반가워요!" and answer["index_version"] == job["version"]


@pytest.mark.parametrize("header", [{}, {"authorization": "Bearer wrong"}, {"authorization": TOKEN}])
async def test_the_job_list_needs_the_token(admin_client: httpx.AsyncClient, header: dict[str, str]) -> None:
    response = await admin_client.get("/admin/jobs", headers=header)
    assert response.status_code == 401 and response.json()["error"]["kind"] == "unauthorized"


@pytest.mark.parametrize("backend", ["files", "redis"])
async def test_the_job_list_is_newest_first_and_each_job_reads_as_its_own_route(
    make_client: AppFactory, own_artifacts: Path, clean_redis: redis.Redis, backend: str
) -> None:
    """candidates.md, Admin: `GET /admin/jobs`, `GET /admin/jobs/{id}`: state, stage, progress,
    counts, newest first."""
    import time

    from app.reindex.jobs import JobStore, RedisJobStore

    store: JobStore = FileJobStore(own_artifacts / "jobs") if backend == "files" else RedisJobStore(clean_redis)
    now = time.time()
    for i, state in enumerate(["succeeded", "failed", "succeeded"]):
        store.save(Job(id=f"job{i}", mode="append", state=state, created_at=now - 30 + i))  # type: ignore[arg-type]
    redis_url = REDIS_URL if backend == "redis" else None
    async with make_client(artifacts_dir=own_artifacts, admin_token=TOKEN, redis_url=redis_url) as client:
        listed = await client.get("/admin/jobs", headers=AUTH)
        assert listed.status_code == 200, listed.text
        jobs = listed.json()["jobs"]
        assert [j["id"] for j in jobs] == ["job2", "job1", "job0"]
        for job in jobs:
            assert job == (await client.get(f"/admin/jobs/{job['id']}", headers=AUTH)).json()
        limited = (await client.get("/admin/jobs?limit=2", headers=AUTH)).json()["jobs"]
        assert [j["id"] for j in limited] == ["job2", "job1"]
        for bad in ("0", "101", "ten"):
            response = await client.get(f"/admin/jobs?limit={bad}", headers=AUTH)
            assert response.status_code == 422 and response.json()["error"]["field"] == "limit", response.text


async def test_an_upload_shows_in_the_job_list(admin_client: httpx.AsyncClient) -> None:
    job = await upload(admin_client, [{"reply": "listed, at last"}])
    jobs = (await admin_client.get("/admin/jobs?limit=1", headers=AUTH)).json()["jobs"]
    assert jobs == [job]


async def test_a_job_whose_lock_expired_is_failed_and_uploads_are_taken(
    make_client: AppFactory, own_artifacts: Path, clean_redis: redis.Redis
) -> None:
    """candidates.md, Admin: a job whose process died is marked failed once its lock has expired, by
    the next upload or job listing, and uploads are taken again."""
    from app.reindex.jobs import LOCK_KEY, RedisJobStore

    job = Job.new("append")  # this host's, as another process's would be
    job.state, job.stage = "running", "encode"
    RedisJobStore(clean_redis).save(job)
    clean_redis.set(f"job:{job.id}", json.dumps({**asdict(job), "updated_at": 0.0}))  # its last news, long ago
    assert RedisLock(clean_redis).acquire(job.token)
    async with make_client(artifacts_dir=own_artifacts, admin_token=TOKEN, redis_url=REDIS_URL) as client:
        found = (await client.get(f"/admin/jobs/{job.id}", headers=AUTH)).json()
        assert found["state"] == "running"  # its token holds the lock: alive, whatever its host
        response = await client.post("/admin/candidates", json=[{"reply": "too soon"}], headers=AUTH)
        assert response.status_code == 409, response.text
        clean_redis.delete(LOCK_KEY)  # the TTL runs out: nobody renewed it
        found = (await client.get(f"/admin/jobs/{job.id}", headers=AUTH)).json()
        assert found["state"] == "failed" and "interrupted" in found["error"]
        response = await client.post("/admin/candidates", json=[{"reply": "after the restart"}], headers=AUTH)
        assert response.status_code == 202, response.text
        assert (await wait_for(client, response.json()["job_id"]))["state"] == "succeeded"


async def test_a_replica_follows_the_pointer_without_a_message(make_client: AppFactory, own_artifacts: Path) -> None:
    """The pointer file is the one owner of what serves: with no message at all (here no Redis, so no
    channel; in production a publish lost to a Redis blip) a replica on the same volume follows it."""
    settings = {"artifacts_dir": own_artifacts, "admin_token": TOKEN, "index_poll_s": 0.1}
    async with make_client(**settings) as replica_a, make_client(**settings) as replica_b:
        job = await upload(replica_a, [{"reply": "found at the pointer", "query": "did you poll?"}])
        assert job["state"] == "succeeded" and job["report"]["after_swap"] == {
            "store": "done",
            "publish": "done",
            "prune": "done",
        }
        for _ in range(100):
            if await version_of(replica_b) == job["version"]:
                break
            await asyncio.sleep(0.05)
        assert await version_of(replica_b) == job["version"]
        rolled = (await replica_b.post("/admin/rollback", headers=AUTH)).json()
        assert rolled["from"] == job["version"] and rolled["to"] == job["previous_version"]
        for _ in range(100):
            if await version_of(replica_a) == rolled["to"]:
                break
            await asyncio.sleep(0.05)
        assert await version_of(replica_a) == rolled["to"]


async def test_an_update_message_is_checked_and_never_becomes_a_path(
    make_client: AppFactory, own_artifacts: Path, clean_redis: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    from app.engine.replicas import CHANNEL

    settings = {"artifacts_dir": own_artifacts, "admin_token": TOKEN, "redis_url": REDIS_URL}
    async with make_client(**settings) as client:
        before = await version_of(client)
        await subscribed(clean_redis, 1)
        for version in ("../../etc", "v20990101T000000000000-abcdef", "not json at all"):
            body = version if version.startswith("not") else json.dumps({"version": version, "origin": "x"})
            clean_redis.publish(CHANNEL, body)
        await asyncio.sleep(1.5)
        assert await version_of(client) == before
    logged = caplog.text
    assert "ignored an index update naming '../../etc'" in logged
    assert "ignored an index update that is not" in logged


async def test_a_version_that_raises_on_load_is_logged_and_kept_for_readiness(
    own_artifacts: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A corrupt version fails its set, with the error kept for /readyz; the service itself loads (#49,
    item 3: it used to fail the whole load, so no other set could serve either)."""
    from app.main import create_app
    from core.store import REPLY_INDEX
    from tests.helpers import settings_for

    store = IndexStore(own_artifacts / "indexes")
    current = store.current()
    assert current is not None
    (store.path(current) / REPLY_INDEX).write_bytes(b"not a faiss index")  # FAISS raises RuntimeError
    app = create_app(settings_for(own_artifacts))
    async with app.router.lifespan_context(app):
        await loaded(app)
        assert app.state.service.load_error is None and app.state.service.runtime.default.serving is None
        failures = [r for r in caplog.records if r.levelname == "ERROR" and r.name == "app.engine.runtime"]
        assert failures and "RuntimeError" in failures[0].getMessage()
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
            ready = await client.get("/readyz")
            assert ready.status_code == 503
            assert ready.json()["problem"].startswith("RuntimeError")


@pytest.mark.parametrize("redis_backed", [False, True])
async def test_a_failed_pointer_write_loses_no_record_and_the_store_follows_the_pointer(
    make_client: AppFactory,
    own_artifacts: Path,
    clean_redis: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
    redis_backed: bool,
) -> None:
    """#49, item 4: the store was written before the pointer. ENOSPC on the pointer during a rollback
    left every replica serving v2 while the store held v1's records, and the next append built on v1,
    silently dropping a reply v2 had; a job that reported 'failed' had still changed the store."""
    from core import store as store_module

    extra = {"redis_url": REDIS_URL} if redis_backed else {}
    async with make_client(artifacts_dir=own_artifacts, admin_token=TOKEN, **extra) as client:
        await upload(client, [{"reply": "only in v2", "id": "v2-only"}])
        v2 = await version_of(client)
        real = store_module.IndexStore.set_current

        def enospc(self: IndexStore, version: str, rollback: bool = False) -> None:
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(store_module.IndexStore, "set_current", enospc)
        with contextlib.suppress(OSError):  # the in-process transport re-raises what the 500 answered
            await client.post("/admin/rollback", headers=AUTH)
        assert await version_of(client) == v2
        job = await upload(client, [{"reply": "only in v3", "id": "v3-only"}], mode="replace")
        assert job["state"] == "failed" and await version_of(client) == v2
        monkeypatch.setattr(store_module.IndexStore, "set_current", real)

        appended = await upload(client, [{"reply": "appended later", "id": "later"}])
        assert appended["state"] == "succeeded"
        ids = {c.key for c in IndexStore(own_artifacts / "indexes").records(appended["version"])}
        assert "v2-only" in ids and "later" in ids and "v3-only" not in ids  # nothing lost, nothing phantom


async def test_a_rollback_whose_pointer_write_fails_is_503_and_changes_nothing(
    admin_client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """#49, item 4: the volume refuses the pointer's write (ENOSPC): the rollback says so, with the
    error shape and a status a client retries, and the version it would have left still serves."""
    from core import failpoints

    first = await version_of(admin_client)
    job = await upload(admin_client, [{"reply": "kept", "id": "kept"}])
    monkeypatch.setattr(failpoints, "_armed", {"store.pointer": {1}})
    monkeypatch.setattr(failpoints, "_hits", failpoints.Counter())
    response = await admin_client.post("/admin/rollback", headers=AUTH)
    assert response.status_code == 503 and response.json()["error"]["kind"] == "not_ready"
    assert await version_of(admin_client) == job["version"] != first
    assert (await admin_client.post("/admin/rollback", headers=AUTH)).json()["to"] == first  # once the volume is back


@pytest.mark.parametrize("on_invalid", ["reject", "skip"])
async def test_a_csv_field_too_long_for_the_csv_module_is_a_4xx_or_skipped(
    admin_client: httpx.AsyncClient, on_invalid: str
) -> None:
    """api.md, Errors and limits: a bad field is a 4xx that names it, `internal_error` never bad
    input. A CSV field over 131,072 characters was a 500 with and without on_invalid=skip."""
    body = b"reply,id\nfine,a\n" + b"x" * 140_000 + b",b\n"
    response = await admin_client.post(
        f"/admin/candidates?on_invalid={on_invalid}", content=body, headers={**AUTH, "content-type": "text/csv"}
    )
    if on_invalid == "reject":
        assert response.status_code == 422, response.text
        assert response.json()["error"]["field"] == "line 3.reply"
    else:
        assert response.status_code == 202, response.text
        job = await wait_for(admin_client, response.json()["job_id"])
        assert job["report"]["skipped_records"][0]["field"] == "line 3.reply" and job["counts"]["uploaded"] == 1


def test_a_staging_directory_of_an_earlier_process_with_this_pid_is_removed(tmp_path: Path) -> None:
    """replicas.md, Scale-out (staging directories): a replica removes the staging directories
    whose process is gone. In a container uvicorn is PID 1 after every restart and the hostname
    is kept, so a killed build's directory named a live process (this one) and was never removed.
    A build's process is known by its pid, its start time and a token of its own, on this boot."""
    store = IndexStore(tmp_path / "indexes")
    earlier = store.stage()  # as an earlier process with this pid wrote it: the same host and pid
    (earlier / OWNER).write_text(
        json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "started": time.time() - 60})
    )
    mine = store.stage()
    assert store.remove_staging() == [earlier.name] and mine.exists()

    from core import process

    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        this_process = json.loads((mine / OWNER).read_text())
        alive = {**this_process, "pid": sleeper.pid, "start": process.start_time(sleeper.pid), "token": "its"}
        running = store.stage()  # a build of another process that still runs
        (running / OWNER).write_text(json.dumps(alive))
        reused = store.stage()  # a build of a process whose pid a live one took since
        (reused / OWNER).write_text(json.dumps({**alive, "start": alive["start"] - 100}))
        rebooted = store.stage()  # a build from before the machine restarted
        (rebooted / OWNER).write_text(json.dumps({**alive, "boot": "another-boot"}))
        restarted = store.stage()  # a build of this container before it restarted: PID 1 then too
        (restarted / OWNER).write_text(json.dumps({**this_process, "pidns": "pid:[1]", "token": "before"}))
        assert sorted(store.remove_staging()) == sorted([reused.name, rebooted.name, restarted.name])
        assert mine.exists() and running.exists()
    finally:
        sleeper.kill()
        sleeper.wait()


async def test_a_rollback_with_nothing_to_go_back_to_is_409_and_every_set_keeps_serving(
    make_client: AppFactory, own_artifacts: Path, tmp_path: Path
) -> None:
    """api.md, Errors and limits: `conflict` 409 when there is nothing to roll back to. A set
    that serves no version (a deployment before its first upload, a set whose first job failed)
    answered 503, the status a client retries, when retrying can never help."""
    async with make_client(artifacts_dir=tmp_path / "fresh", admin_token=TOKEN) as client:
        refused = await client.post("/admin/rollback", headers=AUTH)
        assert refused.status_code == 409, refused.text
        assert refused.json()["error"]["kind"] == "conflict" and refused.json()["error"]["field"] == "set"
    (own_artifacts / "sets" / "empty" / "indexes").mkdir(parents=True)  # a set that holds no version
    async with make_client(artifacts_dir=own_artifacts, admin_token=TOKEN) as client:
        serving = await version_of(client)
        for path in ("/admin/sets/empty/rollback", "/admin/rollback"):  # nothing older than the one version
            refused = await client.post(path, headers=AUTH)
            assert refused.status_code == 409 and refused.json()["error"]["field"] == "set", refused.text
            answer = await client.post("/reply", json={"context": ["hi! how are you?"]})
            assert answer.status_code == 200 and answer.json()["index_version"] == serving
        job = await upload(client, [{"reply": "a first reply", "id": "first"}])  # the refusals let the lock go
        assert job["state"] == "succeeded"


async def _never_all_of_it() -> AsyncIterator[bytes]:
    yield b'[{"reply": "the first bytes of a body whose rest never comes'
    await asyncio.Event().wait()


async def _more_than_the_limit() -> AsyncIterator[bytes]:
    for _ in range(40):  # 40 MiB, chunked: past CHITCHAT_ADMIN_MAX_BODY_BYTES (32 MiB)
        yield b" " * (1 << 20)


# app/main.py installs app.upload_gate.RefuseBeforeBody between AdminGate and BodySizeLimit.
@pytest.mark.parametrize("body", [_never_all_of_it, _more_than_the_limit], ids=["never-arrives", "huge"])
@pytest.mark.parametrize(
    ("path", "status", "field"),
    [
        ("/admin/candidates?encoder=no-such-encoder", 404, "encoder"),
        ("/admin/sets/nobody/candidates?mode=replace&encoder=no-such-encoder", 404, "encoder"),
        ("/admin/sets/nobody/candidates/delete", 404, "set"),
        ("/admin/candidates", 409, None),  # a job of the set holds its lock
    ],
    ids=["encoder", "encoder-new-set", "delete-no-set", "busy"],
)
async def test_what_needs_no_body_is_answered_before_the_body_is_read(
    admin_client: httpx.AsyncClient, body: Any, path: str, status: int, field: str | None
) -> None:
    """candidates.md, Candidate sets and Admin: an unknown encoder is 404 naming `encoder`, checked
    before the body is read; an upload is refused with 409 before its body is read while a job holds
    the lock. Both came after the whole body was read: a body that never came got no answer."""
    admin = admin_client._transport.app.state.service.admin  # type: ignore[attr-defined]
    holding = admin.default.reindexer.claim("a-running-job")
    try:
        with anyio.fail_after(5):
            response = await admin_client.post(path, content=body(), headers=AUTH)
    finally:
        holding.release()
    assert response.status_code == status, response.text
    assert response.json()["error"]["field"] == field


@pytest.mark.parametrize(
    "path", ["/admin/candidates?encoder=no-such-encoder", "/admin/candidates/delete", "/admin/sets/x/candidates/delete"]
)
async def test_a_method_an_upload_route_does_not_take_is_405_not_a_refusal(
    admin_client: httpx.AsyncClient, path: str
) -> None:
    """The API's own contract (chaos scenario 8's schemathesis, ST204): PUT on a route that takes POST only is
    405. The check that answers before the body was read took every PUT for an upload."""
    response = await admin_client.put(path, json=[{"reply": "0"}], headers=AUTH)
    assert response.status_code == 405, response.text


async def test_a_failed_store_write_after_the_swap_fails_no_job_and_the_next_builds_on_the_version(
    admin_client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """candidates.md, Admin, and operations.md, After a fault (the store write fails after a swap): telling the
    replicas, pruning and writing the store come after the swap; the job reports each in
    `report.after_swap`, and a failure there does not fail a job whose version already serves. The
    next job reads the version's own records, since the store says it is another version."""
    from index.candidates import FileCandidateStore

    real = FileCandidateStore.replace
    failures = iter([OSError(28, "No space left on device")])

    def full_once(self: FileCandidateStore, candidates: Any, version: str) -> None:
        failure = next(failures, None)
        if failure is not None:
            raise failure
        real(self, candidates, version)

    monkeypatch.setattr(FileCandidateStore, "replace", full_once)
    job = await upload(admin_client, [{"reply": "served though unstored", "id": "unstored"}])
    assert job["state"] == "succeeded" and await version_of(admin_client) == job["version"]
    assert job["report"]["after_swap"]["store"].startswith("failed: OSError")
    assert job["report"]["after_swap"]["publish"] == job["report"]["after_swap"]["prune"] == "done"
    after = await upload(admin_client, [{"reply": "and one more", "id": "more"}])
    assert after["state"] == "succeeded"
    assert after["counts"]["candidates_after"] == job["counts"]["candidates_after"] + 1  # "unstored" kept


async def test_the_last_three_versions_are_kept_for_rollback(
    admin_client: httpx.AsyncClient, own_artifacts: Path
) -> None:
    """candidates.md, Admin: the last three versions are kept for rollback; older ones are pruned."""
    versions = [await version_of(admin_client)]
    for n in range(4):
        versions.append((await upload(admin_client, [{"reply": f"reply {n}", "id": f"r{n}"}]))["version"])
    assert IndexStore(own_artifacts / "indexes").versions() == versions[-3:]
    rolled = (await admin_client.post("/admin/rollback", headers=AUTH)).json()
    assert (rolled["from"], rolled["to"]) == (versions[-1], versions[-2])
