"""Named candidate sets: several bots in one service, each with its own versions, jobs and
rollback, followed by every replica, and never answering for one another."""

from __future__ import annotations

import asyncio
import shutil
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from tests.helpers import AUTH, REDIS_URL, TOKEN, AppFactory, wait_for

pytestmark = pytest.mark.anyio

ENGLISH = [
    {"query": "hi! how are you?", "reply": "great, thanks for asking!", "id": "en-1"},
    {"query": "what do you do for fun?", "reply": "i play chess in the park", "id": "en-2"},
    {"query": "good night", "reply": "sleep tight!", "id": "en-3"},
]
KOREAN = [
    {"query": "안녕! 잘 지내?", "reply": "응 잘 지내, 고마워!", "id": "ko-1", "language": "ko"},
    {"query": "주말에 뭐 해?", "reply": "공원에서 체스 둬", "id": "ko-2", "language": "ko"},
    {"query": "잘 자", "reply": "좋은 꿈 꿔!", "id": "ko-3", "language": "ko"},
]


@pytest.fixture
def own_artifacts(artifacts: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(artifacts, tmp_path / "artifacts"))


async def upload_to(
    client: httpx.AsyncClient, name: str, records: list[dict[str, Any]], mode: str = "append"
) -> dict[str, Any]:
    response = await client.post(f"/admin/sets/{name}/candidates?mode={mode}", json=records, headers=AUTH)
    assert response.status_code == 202, response.text
    accepted = response.json()
    assert accepted["set"] == name and accepted["status"] == f"/admin/sets/{name}/jobs/{accepted['job_id']}"
    job = await wait_for(client, accepted["job_id"])
    assert job["state"] == "succeeded", job
    return job


@pytest.fixture
async def two_bots(make_client: AppFactory, own_artifacts: Path) -> AsyncIterator[httpx.AsyncClient]:
    async with make_client(artifacts_dir=own_artifacts, admin_token=TOKEN) as client:
        await upload_to(client, "english", ENGLISH)
        await upload_to(client, "korean", KOREAN)
        yield client


async def ids_answering(client: httpx.AsyncClient, name: str, text: str) -> set[str]:
    response = await client.post("/reply", json={"context": [text], "set": name, "k": 10})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["set"] == name
    return {body["id"], *(c["id"] for c in body["candidates"])}


async def test_each_set_answers_only_from_its_own_candidates(two_bots: httpx.AsyncClient) -> None:
    """candidates.md, Candidate sets: each set answers from its own candidates; `set` on `/reply`
    and `/similar`, `default` untouched."""
    for text in ("hi! how are you?", "안녕! 잘 지내?", "tell me about chess", "체스 좋아해?"):
        assert await ids_answering(two_bots, "english", text) <= {"en-1", "en-2", "en-3"}
        assert await ids_answering(two_bots, "korean", text) <= {"ko-1", "ko-2", "ko-3"}
    # The default set is untouched: the tiny test index, none of the bots' replies.
    default = await ids_answering(two_bots, "default", "hi! how are you?")
    assert default.isdisjoint({"en-1", "en-2", "en-3", "ko-1", "ko-2", "ko-3"})
    similar = (await two_bots.post("/similar", json={"text": "잘 자", "set": "korean", "k": 1})).json()
    assert similar["set"] == "korean" and similar["matches"][0]["reply"] == "좋은 꿈 꿔!"


async def test_one_session_id_sent_to_two_sets_is_two_conversations(two_bots: httpx.AsyncClient) -> None:
    """candidates.md, Candidate sets: sessions are per set."""
    for name, message in (("english", "good night"), ("korean", "잘 자"), ("english", "hi! how are you?")):
        body = {"session_id": "shared-id", "message": message, "set": name}
        response = await two_bots.post("/reply", json=body)
        assert response.status_code == 200 and response.json()["session_id"] == "shared-id", response.text
    sessions = two_bots._transport.app.state.service.runtime.sessions  # type: ignore[attr-defined]
    english = [t.text for t in (await sessions.history("english/shared-id")).turns]
    korean = [t.text for t in (await sessions.history("korean/shared-id")).turns]
    assert english[0::2] == ["good night", "hi! how are you?"] and korean[0::2] == ["잘 자"]
    assert not (await sessions.history("shared-id")).turns  # the default set's conversation of that id


async def test_a_reindex_under_load_never_crosses_sets(two_bots: httpx.AsyncClient) -> None:
    """Both sets asked without pause while each is reindexed: every answer comes from its own set, none fails."""
    stop = asyncio.Event()
    answered: dict[str, list[set[str]]] = {"english": [], "korean": []}

    async def ask(name: str, text: str) -> None:
        while not stop.is_set():
            answered[name].append(await ids_answering(two_bots, name, text))

    askers = [asyncio.create_task(ask("english", "hi! how are you?")), asyncio.create_task(ask("korean", "잘 자"))]
    await upload_to(two_bots, "english", [{"query": "nice weather", "reply": "sunny all week", "id": "en-4"}])
    await upload_to(two_bots, "korean", [{"query": "배고파", "reply": "라면 먹자", "id": "ko-4", "language": "ko"}])
    stop.set()
    await asyncio.gather(*askers)
    assert all(ids <= {"en-1", "en-2", "en-3", "en-4"} for ids in answered["english"])
    assert all(ids <= {"ko-1", "ko-2", "ko-3", "ko-4"} for ids in answered["korean"])
    assert answered["english"] and answered["korean"]


async def test_sets_are_listed_rolled_back_and_deleted(two_bots: httpx.AsyncClient) -> None:
    """candidates.md, Admin: `GET /admin/sets` (counts, index bytes, limits), a set's own rollback
    and jobs, `DELETE /admin/sets/{name}` (never `default`: 409)."""
    listed = (await two_bots.get("/admin/sets", headers=AUTH)).json()
    by_name = {s["name"]: s for s in listed["sets"]}
    assert set(by_name) == {"default", "english", "korean"}
    assert by_name["korean"]["replies"] == 3 and by_name["korean"]["index_bytes"] > 0
    assert listed["limits"]["max_sets"] >= 3

    first = by_name["english"]["version"]
    job = await upload_to(two_bots, "english", [{"reply": "a later reply", "id": "en-9"}])
    korean_before = (await two_bots.get("/admin/sets/korean/index", headers=AUTH)).json()["current"]
    rolled = (await two_bots.post("/admin/sets/english/rollback", headers=AUTH)).json()
    assert (rolled["set"], rolled["from"], rolled["to"]) == ("english", job["version"], first)
    assert (await two_bots.get("/admin/sets/korean/index", headers=AUTH)).json()["current"] == korean_before
    jobs = (await two_bots.get("/admin/sets/english/jobs", headers=AUTH)).json()["jobs"]
    assert job["id"] in {j["id"] for j in jobs}
    assert job["id"] not in {j["id"] for j in (await two_bots.get("/admin/jobs", headers=AUTH)).json()["jobs"]}

    assert (await two_bots.delete("/admin/sets/english", headers=AUTH)).json() == {"deleted": "english"}
    gone = await two_bots.post("/reply", json={"context": ["hi"], "set": "english"})
    assert gone.status_code == 404 and gone.json()["error"]["field"] == "set"
    assert (await two_bots.delete("/admin/sets/english", headers=AUTH)).status_code == 404
    refused = await two_bots.delete("/admin/sets/default", headers=AUTH)
    assert refused.status_code == 409
    assert await ids_answering(two_bots, "korean", "잘 자") <= {"ko-1", "ko-2", "ko-3"}


@pytest.mark.parametrize("name", ["../etc", "Upper", "a" * 33, "-dash", "sp ace", ".hidden", ""])
async def test_a_set_name_is_checked_before_it_becomes_a_path(two_bots: httpx.AsyncClient, name: str) -> None:
    """candidates.md, Candidate sets: names are checked before they become paths or keys (422
    naming `set`)."""
    response = await two_bots.post("/reply", json={"context": ["hi"], "set": name})
    assert response.status_code == 422 and response.json()["error"]["field"] == "set", response.text
    upload = await two_bots.post(f"/admin/sets/{name}/candidates", json=[{"reply": "x"}], headers=AUTH)
    assert upload.status_code in (404, 405, 422), upload.text  # "" and "../etc" do not even route
    assert not any(p.name.startswith(".") for p in (two_bots_root(two_bots) / "sets").iterdir())


def two_bots_root(client: httpx.AsyncClient) -> Path:
    app = client._transport.app  # type: ignore[attr-defined]
    return Path(app.state.service.runtime.settings.artifacts_dir)


async def test_an_unknown_set_is_a_404_naming_it(two_bots: httpx.AsyncClient) -> None:
    """candidates.md, Candidate sets: an unknown set is 404 `not_found` with `field: "set"`."""
    for response in (
        await two_bots.post("/reply", json={"context": ["hi"], "set": "nobody"}),
        await two_bots.post("/similar", json={"text": "hi", "set": "nobody"}),
        await two_bots.get("/admin/sets/nobody/index", headers=AUTH),
        await two_bots.post("/admin/sets/nobody/candidates/delete", json=[{"id": "x"}], headers=AUTH),
    ):
        assert response.status_code == 404 and response.json()["error"]["field"] == "set", response.text


async def test_limits_on_sets_and_candidates_are_clear_4xx(make_client: AppFactory, own_artifacts: Path) -> None:
    """candidates.md, Candidate sets: past CHITCHAT_MAX_SETS a new set is 409 naming `set` (and
    leaves no directory); past CHITCHAT_MAX_TOTAL_CANDIDATES an upload is 413 naming `records`."""
    async with make_client(artifacts_dir=own_artifacts, admin_token=TOKEN, max_sets=2) as client:
        await upload_to(client, "english", ENGLISH)
        third = await client.post("/admin/sets/korean/candidates", json=KOREAN, headers=AUTH)
        assert third.status_code == 409 and third.json()["error"]["field"] == "set", third.text
        assert not (own_artifacts / "sets" / "korean").exists()
    async with make_client(artifacts_dir=own_artifacts, admin_token=TOKEN, max_total_candidates=25) as client:
        too_many = [{"reply": f"reply number {i}", "id": f"n-{i}"} for i in range(10)]
        refused = await client.post("/admin/sets/english/candidates", json=too_many, headers=AUTH)
        assert refused.status_code == 413 and refused.json()["error"]["field"] == "records", refused.text


async def test_a_replica_finds_a_new_set_and_drops_a_deleted_one(
    make_client: AppFactory, own_artifacts: Path, clean_redis: redis.Redis
) -> None:
    """candidates.md, Candidate sets: a set exists while its directory does; every replica finds new
    sets and drops deleted ones; a set's keys live under `set:<name>:`."""
    settings = {"artifacts_dir": own_artifacts, "admin_token": TOKEN, "index_poll_s": 0.1, "redis_url": REDIS_URL}
    async with make_client(**settings) as replica_a, make_client(**settings) as replica_b:
        await upload_to(replica_a, "korean", KOREAN)
        for _ in range(100):
            if (await replica_b.post("/reply", json={"context": ["잘 자"], "set": "korean"})).status_code == 200:
                break
            await asyncio.sleep(0.05)
        assert await ids_answering(replica_b, "korean", "잘 자") <= {"ko-1", "ko-2", "ko-3"}
        # The set's candidates and jobs live under its own Redis keys, not the default set's.
        assert clean_redis.hlen("set:korean:candidates") == 3 and not clean_redis.exists("candidates")
        assert (await replica_b.delete("/admin/sets/korean", headers=AUTH)).status_code == 200
        for _ in range(100):
            if (await replica_a.post("/reply", json={"context": ["잘 자"], "set": "korean"})).status_code == 404:
                break
            await asyncio.sleep(0.05)
        assert (await replica_a.post("/reply", json={"context": ["잘 자"], "set": "korean"})).status_code == 404
        assert not clean_redis.exists("set:korean:candidates")


async def test_a_delete_that_redis_fails_can_be_retried_and_leaves_nothing_behind(
    make_client: AppFactory, own_artifacts: Path, clean_redis: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """#49, item 7: the directory went first and the Redis hash after. A Redis error in between gave a
    503, then a 404 on every retry, and the hash survived: re-creating the name with append built on
    the deleted set's records. Its job keys were never deleted."""
    from index.candidates import RedisCandidateStore

    async with make_client(artifacts_dir=own_artifacts, admin_token=TOKEN, redis_url=REDIS_URL) as client:
        await upload_to(client, "english", ENGLISH)
        assert clean_redis.keys("set:english:job:*")
        real_remove = RedisCandidateStore.remove
        failures = iter([redis.ConnectionError("Redis went away")])

        def flaky_remove(self: RedisCandidateStore) -> None:
            failure = next(failures, None)
            if failure is not None:
                raise failure
            real_remove(self)

        monkeypatch.setattr(RedisCandidateStore, "remove", flaky_remove)
        failed = await client.delete("/admin/sets/english", headers=AUTH)
        assert failed.status_code == 503, failed.text
        assert (await client.post("/reply", json={"context": ["hi"], "set": "english"})).status_code == 200
        assert (await client.delete("/admin/sets/english", headers=AUTH)).json() == {"deleted": "english"}
        assert clean_redis.keys("set:english:*") == []  # records, the written flag, jobs and their listing
        job = await upload_to(client, "english", [{"reply": "a fresh start", "id": "new-1"}], mode="append")
        assert job["counts"]["candidates_before"] == 0 and job["counts"]["candidates_after"] == 1


async def test_set_limits_hold_across_replicas_and_a_failed_first_upload_takes_no_slot(
    make_client: AppFactory, own_artifacts: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """#49, item 10: the limits were per replica. A replica that had not discovered another's set could
    pass CHITCHAT_MAX_SETS and the total-candidates limit, and a failed first upload left a set with
    nothing in it that used up a slot."""
    from app.engine import replicas

    limits = {"artifacts_dir": own_artifacts, "admin_token": TOKEN, "max_sets": 3, "max_total_candidates": 28}
    monkeypatch.setattr(replicas.Follower, "follow", lambda self: _not_following())  # neither sees the other's
    async with make_client(**limits) as first, make_client(**limits) as second:
        await upload_to(first, "english", ENGLISH)  # 3 candidates, on the volume
        failed = await first.post("/admin/sets/broken/candidates?on_invalid=skip", json=[{"id": "x"}], headers=AUTH)
        if failed.status_code == 202:
            job = await wait_for(first, failed.json()["job_id"])
            assert job["state"] == "failed"  # nothing valid: the set holds no version
        await upload_to(second, "korean", KOREAN)  # the third set: default, english, korean (broken holds nothing)
        refused = await second.post("/admin/sets/fourth/candidates", json=KOREAN, headers=AUTH)
        assert refused.status_code == 409 and refused.json()["error"]["field"] == "set", refused.text
        many = [{"reply": f"reply number {i}", "id": f"n-{i}"} for i in range(5)]
        over = await second.post(
            "/admin/sets/korean/candidates", json=many, headers=AUTH
        )  # 18 (default) + 3 + 3 + 5 > 28
        assert over.status_code == 413 and over.json()["error"]["field"] == "records", over.text


async def _not_following() -> bool:
    return False


class HeldBuilds:
    """Index builds of the sets named in `held` wait until released, then fail if told to: a first
    job that is still running, or that fails and leaves its set holding nothing."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, *held: str) -> None:
        from app.reindex import reindexer

        self.release = {name: threading.Event() for name in held}
        self.fail: set[str] = set()
        real = reindexer.build_version

        def build(candidates: Any, encoder: Any, checksum: str, store: Any, *args: Any, **kwargs: Any) -> Any:
            name = store.root.parent.name
            if name in self.release:
                assert self.release[name].wait(30)
                if name in self.fail:
                    raise OSError(28, "No space left on device")
            return real(candidates, encoder, checksum, store, *args, **kwargs)

        monkeypatch.setattr(reindexer, "build_version", build)

    def end(self, name: str, fail: bool = False) -> None:
        if fail:
            self.fail.add(name)
        self.release[name].set()


async def submitted(client: httpx.AsyncClient, name: str, records: list[dict[str, Any]]) -> httpx.Response:
    return await client.post(f"/admin/sets/{name}/candidates", json=records, headers=AUTH)


async def test_sets_whose_first_job_runs_take_a_slot_and_one_that_failed_takes_it_at_its_next_upload(
    make_client: AppFactory, own_artifacts: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """candidates.md, Candidate sets: CHITCHAT_MAX_SETS bounds a replica's memory; a new set past it is
    409 naming `set`. Only sets that held a version were counted: first uploads sent together all
    passed (none held one yet), and a set whose first job failed took no slot, so its next upload
    made a set past the limit (18 sets under a limit of 16). A set's job never waits for another set's
    lock: english's upload is taken while broken's job runs."""
    held = HeldBuilds(monkeypatch, "english", "broken")
    async with make_client(artifacts_dir=own_artifacts, admin_token=TOKEN, max_sets=3) as client:
        first = await submitted(client, "broken", KOREAN)  # its build runs on, for now
        assert first.status_code == 202, first.text
        second = await submitted(client, "english", ENGLISH)
        assert second.status_code == 202, second.text
        refused = await submitted(client, "fourth", ENGLISH)  # default, broken, english: the limit of 3
        assert refused.status_code == 409 and refused.json()["error"]["field"] == "set", refused.text
        busy = await client.delete("/admin/sets/english", headers=AUTH)  # Admin: 409 while its job runs
        assert busy.status_code == 409 and busy.json()["error"]["kind"] == "conflict", busy.text

        held.end("broken", fail=True)  # its first job fails: the set holds nothing, and gives its slot back
        assert (await wait_for(client, first.json()["job_id"]))["state"] == "failed"
        taken = await submitted(client, "fourth", ENGLISH)
        assert taken.status_code == 202, taken.text
        held.end("english")
        assert (await wait_for(client, second.json()["job_id"]))["state"] == "succeeded"
        assert (await wait_for(client, taken.json()["job_id"]))["state"] == "succeeded"
        again = await submitted(client, "broken", KOREAN)  # a set with nothing in it is a new set
        assert again.status_code == 409 and again.json()["error"]["field"] == "set", again.text
        listed = {s["name"] for s in (await client.get("/admin/sets", headers=AUTH)).json()["sets"] if s.get("version")}
        assert listed == {"default", "english", "fourth"}


async def test_the_candidate_limit_counts_records_and_the_jobs_still_running(
    make_client: AppFactory, own_artifacts: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """candidates.md, Candidate sets: CHITCHAT_MAX_TOTAL_CANDIDATES bounds the candidates over every
    set; an upload that would pass it is 413 naming `records`. Other sets were counted by their
    distinct replies (a reply with two queries is two candidates), and a job still running was not
    counted at all."""
    faq = [
        {"query": q, "reply": r, "id": f"faq-{i}"}
        for i, (q, r) in enumerate([("hi", "hello!"), ("hey", "hello!"), ("bye", "see you"), ("cya", "see you")])
    ]
    held = HeldBuilds(monkeypatch, "running")
    # The default set's 18 records, faq's 4 (2 distinct replies), a running job's 3: 25.
    async with make_client(artifacts_dir=own_artifacts, admin_token=TOKEN, max_total_candidates=27) as client:
        await upload_to(client, "faq", faq)
        running = await submitted(client, "running", ENGLISH)
        assert running.status_code == 202, running.text
        over = await submitted(client, "english", ENGLISH)  # 25 + 3 > 27
        assert over.status_code == 413 and over.json()["error"]["field"] == "records", over.text
        fits = await submitted(client, "english", ENGLISH[:2])  # 25 + 2 = 27
        assert fits.status_code == 202, fits.text
        held.end("running")
        for job in (running, fits):
            assert (await wait_for(client, job.json()["job_id"]))["state"] == "succeeded"


async def test_a_job_record_that_cannot_be_read_refuses_no_upload(make_client: AppFactory, own_artifacts: Path) -> None:
    """The limits read every set's jobs to count the running ones: a broken job record of one set
    is counted as no job running, not a 500 for every upload."""
    jobs = own_artifacts / "sets" / "broken" / "jobs"
    jobs.mkdir(parents=True)
    (jobs / "deadbeef.json").write_text("{not json")
    async with make_client(artifacts_dir=own_artifacts, admin_token=TOKEN) as client:
        await upload_to(client, "english", ENGLISH)


async def test_a_set_with_no_version_yet_has_an_index_answer_not_an_outage(two_bots: httpx.AsyncClient) -> None:
    """A set whose first version is still building (or failed to) answers GET .../index with nothing
    current, 200: a 503 there read as the service being down (found by tests/test_schema_fuzz.py)."""
    runtime = two_bots._transport.app.state.service.runtime  # type: ignore[attr-defined]
    runtime.add_set("pending").problem = "set 'pending' has no index version yet"
    response = await two_bots.get("/admin/sets/pending/index", headers=AUTH)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["current"] is None and body["versions"] == [] and body["problem"].endswith("no index version yet")
    assert (await two_bots.get("/admin/sets/english/index", headers=AUTH)).json()["problem"] is None
