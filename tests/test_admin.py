"""Admin: auth, uploads, zero-downtime reindex, rollback, crash recovery, replicas."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from app.engine.jobs import FileJobStore, Job, RedisLock
from index.store import IndexStore
from tests.conftest import REDIS_URL, AppFactory

pytestmark = pytest.mark.anyio

TOKEN = "s3cret-token"
AUTH = {"authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def own_artifacts(artifacts: Path, tmp_path: Path) -> Path:
    """A private copy: these tests write versions, pointers and stores."""
    copy = tmp_path / "artifacts"
    shutil.copytree(artifacts, copy)
    return copy


@pytest.fixture
def clean_redis(redis_client: redis.Redis) -> redis.Redis:
    redis_client.flushdb()
    return redis_client


@pytest.fixture
async def admin_client(make_client: AppFactory, own_artifacts: Path) -> AsyncIterator[httpx.AsyncClient]:
    async with make_client(artifacts_dir=own_artifacts, admin_token=TOKEN) as client:
        yield client


async def wait_for(client: httpx.AsyncClient, job_id: str, timeout_s: float = 60) -> dict[str, Any]:
    for _ in range(int(timeout_s * 20)):
        job = (await client.get(f"/admin/jobs/{job_id}", headers=AUTH)).json()
        if job["state"] in ("succeeded", "failed"):
            return job
        await asyncio.sleep(0.05)
    raise AssertionError(f"job {job_id} did not finish: {job}")


async def upload(client: httpx.AsyncClient, records: list[dict[str, Any]], mode: str = "append") -> dict[str, Any]:
    response = await client.post(f"/admin/candidates?mode={mode}", json=records, headers=AUTH)
    assert response.status_code == 202, response.text
    return await wait_for(client, response.json()["job_id"])


async def version_of(client: httpx.AsyncClient) -> str:
    return str((await client.get("/readyz")).json()["index_version"])


ADMIN_CALLS = [
    ("POST", "/admin/candidates", [{"reply": "hi"}]),
    ("GET", "/admin/jobs/abc", None),
    ("GET", "/admin/index", None),
    ("POST", "/admin/rollback", None),
]


@pytest.mark.parametrize(("method", "path", "body"), ADMIN_CALLS)
async def test_admin_is_disabled_without_a_configured_token(
    client: httpx.AsyncClient, method: str, path: str, body: Any
) -> None:
    response = await client.request(method, path, json=body, headers=AUTH)
    assert response.status_code == 401
    assert response.json()["error"]["kind"] == "unauthorized"


@pytest.mark.parametrize(("method", "path", "body"), ADMIN_CALLS)
@pytest.mark.parametrize("header", [{}, {"authorization": "Bearer wrong"}, {"authorization": TOKEN}])
async def test_every_admin_route_needs_the_token(
    admin_client: httpx.AsyncClient, method: str, path: str, body: Any, header: dict[str, str]
) -> None:
    response = await admin_client.request(method, path, json=body, headers=header)
    assert response.status_code == 401
    assert response.json()["error"]["field"] == "authorization"


async def test_append_reindexes_and_the_new_candidate_answers(admin_client: httpx.AsyncClient) -> None:
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


async def test_ndjson_delete_and_replace(admin_client: httpx.AsyncClient) -> None:
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
]


@pytest.mark.parametrize(
    ("case", "body", "content_type", "status", "field"), BAD_UPLOADS, ids=[b[0] for b in BAD_UPLOADS]
)
async def test_bad_uploads_name_the_line_and_leave_the_old_version_serving(
    admin_client: httpx.AsyncClient, case: str, body: bytes, content_type: str, status: int, field: str
) -> None:
    before = await version_of(admin_client)
    response = await admin_client.post(
        "/admin/candidates", content=body, headers={**AUTH, "content-type": content_type}
    )
    assert response.status_code == status, response.text
    assert response.json()["error"]["field"] == field
    assert await version_of(admin_client) == before


async def test_oversize_uploads_and_record_counts_are_refused(make_client: AppFactory, own_artifacts: Path) -> None:
    async with make_client(
        artifacts_dir=own_artifacts, admin_token=TOKEN, admin_max_body_bytes=2048, admin_max_records=3
    ) as client:
        before = await version_of(client)
        big = await client.post("/admin/candidates", json=[{"reply": "x" * 900}] * 3, headers=AUTH)
        assert big.status_code == 413 and big.json()["error"]["kind"] == "payload_too_large"
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
    async with make_client(artifacts_dir=own_artifacts, admin_token=TOKEN, redis_url=REDIS_URL) as client:
        assert RedisLock(clean_redis).acquire("another-replica")  # as if another replica were reindexing
        response = await client.post("/admin/candidates", json=[{"reply": "x"}], headers=AUTH)
        assert response.status_code == 409 and response.json()["error"]["kind"] == "conflict"
        assert (await client.post("/admin/rollback", headers=AUTH)).status_code == 409


async def test_rollback_serves_the_previous_version(admin_client: httpx.AsyncClient) -> None:
    first = await version_of(admin_client)
    job = await upload(admin_client, [{"reply": "new!", "query": "what's new?"}])
    response = await admin_client.post("/admin/rollback", headers=AUTH)
    assert response.json() == {"from": job["version"], "to": first}
    assert await version_of(admin_client) == first
    assert (await admin_client.post("/admin/rollback", headers=AUTH)).status_code == 409  # nothing older


async def test_a_crash_mid_build_leaves_the_current_version_and_fails_the_job(
    make_client: AppFactory, own_artifacts: Path
) -> None:
    store = IndexStore(own_artifacts / "indexes")
    serving = store.current()
    staging = store.stage()  # what a build that died halfway leaves behind
    (staging / "replies.faiss").write_bytes(b"partial")
    FileJobStore(own_artifacts / "jobs").save(Job(id="deadbeef", mode="append", state="running", stage="encode"))

    async with make_client(artifacts_dir=own_artifacts, admin_token=TOKEN) as client:
        assert await version_of(client) == serving
        job = (await client.get("/admin/jobs/deadbeef", headers=AUTH)).json()
        assert job["state"] == "failed" and "interrupted" in job["error"]
    assert not staging.exists()


async def test_reindex_under_load_never_errors_and_each_reply_has_one_version(admin_client: httpx.AsyncClient) -> None:
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
        await asyncio.sleep(0.2)  # both listeners subscribed
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
