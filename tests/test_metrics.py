"""/metrics after real requests: the values move as the traffic says they should."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.main import create_app
from app.metrics import REDIS_OPERATIONS, REINDEX_OUTCOMES
from core.laps import Laps
from tests.helpers import AppFactory, closed_port, loaded, settings_for

pytestmark = pytest.mark.anyio

TOKEN = "metrics-token"


async def scrape(client: httpx.AsyncClient) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = await client.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def value(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


async def test_requests_answers_cache_and_encoder_are_counted(make_client: AppFactory) -> None:
    async with make_client() as client:
        for text in ["my cat is sick", "do you like dogs?", "my cat is sick"]:  # the repeat hits the cache
            assert (await client.post("/reply", json={"context": [text]})).status_code == 200
        await client.post("/reply", json={"context": []})  # 422
        await client.get("/no/such/page")  # 404, under one route label whatever the path
        samples = await scrape(client)
    assert value(samples, "chitchat_http_requests_total", route="/reply", method="POST", status="200") == 3
    assert value(samples, "chitchat_http_requests_total", route="/reply", method="POST", status="422") == 1
    assert value(samples, "chitchat_http_requests_total", route="unmatched", method="GET", status="404") == 1
    assert value(samples, "chitchat_http_request_seconds_count", route="/reply", status="200") == 3
    assert value(samples, "chitchat_http_request_seconds_count", route="/reply", status="422") == 1
    answered = sum(v for (name, _), v in samples.items() if name == "chitchat_answers_total")
    assert answered == 3
    assert value(samples, "chitchat_cache_hits_total") >= 1 and value(samples, "chitchat_cache_misses_total") >= 2
    assert value(samples, "chitchat_cache_local_bytes") > 0  # the vectors the two fresh contexts left behind
    assert value(samples, "chitchat_encoder_batch_requests_count") == 2  # the repeat never reached the encoder
    assert value(samples, "chitchat_encoder_queue_depth") == 0
    served = [labels for (name, labels) in samples if name == "chitchat_serving_info"]
    assert len(served) == 1 and dict(served[0])["bundle"] == "tiny-int8"
    assert value(samples, "chitchat_redis_up") == -1  # none configured


async def test_each_stage_of_a_request_is_timed(make_client: AppFactory) -> None:
    async with make_client() as client:
        # A request's own query threshold has the last turn encoded (as a stored turn) beside the
        # context; nothing stored scores 1.0 to this one, so reply matching answers.
        session_turn = {"session_id": "stages", "message": "my cat is so sick", "thresholds": {"query_similarity": 1.0}}
        first = await client.post("/reply", json=session_turn)
        assert first.status_code == 200 and first.json()["source"] == "reply_matching"
        again = await client.post("/reply", json={"context": ["my cat is so sick"], "strategies": ["query_similarity"]})
        assert again.status_code == 200  # a cache hit: nothing to tokenise, encode or write
        samples = await scrape(client)

    def count(stage: str) -> float:
        return value(samples, "chitchat_stage_seconds_count", stage=stage)

    for stage in ("session_read", "tokenize", "queue_wait", "encode", "cache_write", "session_write"):
        assert count(stage) == 1, stage
    assert count("cache_read") == 2
    assert count("search_replies") == 1 and count("search_queries") == 2  # reply matching once, query similarity twice
    assert all(value(samples, "chitchat_stage_seconds_sum", stage=s) > 0 for s in ("encode", "search_replies"))


def test_a_stage_timed_inside_another_counts_once() -> None:
    laps = Laps()
    with laps.time("reactions"):
        time.sleep(0.01)
        with laps.time("read_turn"):
            time.sleep(0.03)
    assert laps.seconds["read_turn"] >= 0.03
    assert 0.01 <= laps.seconds["reactions"] < 0.03  # the reader's pass is its own, not the reactions'


async def test_reindex_jobs_and_redis_trouble_are_counted(
    make_client: AppFactory, artifacts: Path, tmp_path: Path
) -> None:
    import shutil

    own = tmp_path / "artifacts"
    shutil.copytree(artifacts, own)
    redis_url = f"redis://127.0.0.1:{closed_port()}/0"
    async with make_client(artifacts_dir=own, admin_token=TOKEN, redis_url=redis_url) as client:
        await client.post("/reply", json={"session_id": "m-1", "message": "hello"})
        headers = {"authorization": f"Bearer {TOKEN}"}
        # With a Redis URL, jobs and the candidate store live in Redis: down, the upload is refused.
        upload = await client.post("/admin/candidates", json=[{"reply": "metrics!"}], headers=headers)
        samples = await scrape(client)
    assert upload.status_code == 503  # admin needs its store: refused, said why
    assert value(samples, "chitchat_redis_up") == 0
    assert sum(v for (name, _), v in samples.items() if name == "chitchat_redis_errors_total") >= 1
    assert value(samples, "chitchat_redis_bypass_seconds_total") > 0


async def test_reindex_outcomes_and_durations(make_client: AppFactory, artifacts: Path, tmp_path: Path) -> None:
    import shutil

    own = tmp_path / "artifacts"
    shutil.copytree(artifacts, own)
    async with make_client(artifacts_dir=own, admin_token=TOKEN) as client:
        headers = {"authorization": f"Bearer {TOKEN}"}
        job = (await client.post("/admin/candidates", json=[{"reply": "metrics!"}], headers=headers)).json()
        for _ in range(600):
            state = (await client.get(f"/admin/jobs/{job['job_id']}", headers=headers)).json()["state"]
            if state in ("succeeded", "failed"):
                break
            await asyncio.sleep(0.05)
        samples = await scrape(client)
    assert value(samples, "chitchat_reindex_jobs_total", outcome="succeeded") == 1
    assert value(samples, "chitchat_reindex_seconds_count") == 1
    assert value(samples, "chitchat_index_entries", kind="replies") == 19  # 18 tiny candidates + the upload


async def test_labelled_series_exist_at_zero_before_anything_happens(make_client: AppFactory) -> None:
    """rate() over a series that appears at its first event misses that event; these are there from the start."""
    async with make_client(admin_token=TOKEN) as client:
        samples = await scrape(client)
    expected = [
        *(("chitchat_answers_total", {"source": s}) for s in ("query_similarity", "reply_matching", "reaction")),
        *(("chitchat_reindex_jobs_total", {"outcome": o}) for o in ("succeeded", "failed")),
        *(("chitchat_redis_errors_total", {"operation": op}) for op in REDIS_OPERATIONS),
        *(("chitchat_refused_total", {"queue": q}) for q in ("in_flight", "encoder", "search")),
    ]
    for name, labels in expected:
        assert samples.get((name, tuple(sorted(labels.items())))) == 0.0, (name, labels)
    assert set(REINDEX_OUTCOMES) == {"succeeded", "failed"}


def test_the_redis_operations_listed_are_the_ones_the_guard_counts() -> None:
    source = (Path(__file__).resolve().parents[1] / "app" / "engine" / "kv.py").read_text()
    # A session call names its operation to `_session_call`, which counts its failures under that name.
    assert set(re.findall(r'(?:_failed|_session_call)\(\s*"(\w+)"', source)) == set(REDIS_OPERATIONS)


async def test_a_full_encoder_queue_is_a_429_and_counted(artifacts: Path) -> None:
    app = create_app(settings_for(artifacts))
    async with app.router.lifespan_context(app):
        await loaded(app)
        # No room at all: every request that needs the encoder is refused, with no race against a worker.
        app.state.service.runtime.encoder_queue.max_pending = 0
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
            refused = await client.post("/reply", json={"context": ["is anyone there?"]})
            samples = await scrape(client)
    assert refused.status_code == 429 and refused.json()["error"]["kind"] == "overloaded"
    assert value(samples, "chitchat_refused_total", queue="encoder") == 1
    assert value(samples, "chitchat_refused_total", queue="search") == 0
    assert value(samples, "chitchat_http_requests_total", route="/reply", method="POST", status="429") == 1
    assert value(samples, "chitchat_http_request_seconds_count", route="/reply", status="429") == 1


async def test_past_the_in_flight_limit_a_request_is_a_429_and_counted(artifacts: Path) -> None:
    app = create_app(settings_for(artifacts))
    async with app.router.lifespan_context(app):
        await loaded(app)
        app.state.service.admission.max_in_flight = 0
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
            refused = await client.post("/reply", json={"context": ["is anyone there?"]})
            health = await client.get("/readyz")  # only the encoder's routes are counted
            samples = await scrape(client)
    assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
    assert health.status_code == 200
    assert value(samples, "chitchat_refused_total", queue="in_flight") == 1
    assert value(samples, "chitchat_refused_total", queue="encoder") == 0
    assert value(samples, "chitchat_in_flight") == 0
    assert value(samples, "chitchat_http_requests_total", route="/reply", method="POST", status="429") == 1


async def test_a_probe_that_waited_its_turn_is_counted(make_client: AppFactory) -> None:
    """httpx's ASGI transport is one connection: its second probe within a second has the next turn at
    once, its third waits one (50 ms at 20 a second)."""
    async with make_client(probe_rate_per_s=20) as client:
        assert value(await scrape(client), "chitchat_probes_paced_total") == 0
        for _ in range(3):
            assert (await client.get("/livez")).status_code == 200
        assert value(await scrape(client), "chitchat_probes_paced_total") == 1
