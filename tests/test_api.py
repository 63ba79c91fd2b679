"""/reply, /similar and the health routes on the tiny bundle, no Redis."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest

from app.engine.runtime import build_runtime
from core.encoder import OUTPUT_NAMES, Encoder
from tests.helpers import PAIRS, REPLY_ONLY, TOKEN, AppFactory, settings_for, upload

pytestmark = pytest.mark.anyio


async def test_reply_with_a_stored_query_answers_by_query_similarity(client: httpx.AsyncClient) -> None:
    response = await client.post("/reply", json={"context": ["my cat is sick"]})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["reply"] == "oh no, i hope she gets better soon"
    assert body["source"] == "query_similarity"
    assert body["score"] == pytest.approx(1.0, abs=1e-3)
    assert body["index_version"].startswith("v")
    assert body["candidates"][0]["text"] == body["reply"]


async def test_reply_matching_alone_scores_replies_against_the_context(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/reply", json={"context": ["do you play any sports?"], "strategies": ["reply_matching"], "k": 3}
    )
    body = response.json()
    assert body["source"] == "reply_matching"
    assert len(body["candidates"]) == 3
    assert all(c["source"] == "reply_matching" for c in body["candidates"])
    scores = [c["score"] for c in body["candidates"]]
    assert scores == sorted(scores, reverse=True)


async def test_the_users_own_words_never_come_back(client: httpx.AsyncClient) -> None:
    # The last turn is a stored reply verbatim, so its own vector is the nearest: the echo check drops it,
    # and its near copies with it.
    for last in ["haha that's funny", "Haha, that's funny!!", "haha thats funny"]:
        body = (await client.post("/reply", json={"context": ["what's up", last], "k": 50})).json()
        assert "haha that's funny" not in [c["text"] for c in body["candidates"]]
        assert body["reply"] != "haha that's funny"


async def test_k_bounds_the_candidate_list(client: httpx.AsyncClient) -> None:
    body = (await client.post("/reply", json={"context": ["hello there"], "k": 50})).json()
    distinct_replies = len({r for _, r in PAIRS} | set(REPLY_ONLY))
    assert len(body["candidates"]) <= min(50, distinct_replies)
    assert len({c["id"] for c in body["candidates"]}) == len(body["candidates"])


async def test_similar_text_returns_stored_queries_with_their_replies(client: httpx.AsyncClient) -> None:
    body = (await client.post("/similar", json={"text": "do you like dogs?", "k": 3})).json()
    assert len(body["matches"]) == 3
    assert body["matches"][0] == {
        "query": "do you like dogs?",
        "reply": "i love dogs, i have a golden retriever",
        "score": pytest.approx(1.0, abs=1e-3),
    }
    assert "scores" not in body


async def test_similar_pairs_returns_one_cosine_per_pair(client: httpx.AsyncClient) -> None:
    pairs = [["good night", "good night"], ["good night", "i study computer science"]]
    body = (await client.post("/similar", json={"pairs": pairs})).json()
    assert len(body["scores"]) == 2
    assert body["scores"][0] == pytest.approx(1.0, abs=1e-3)
    assert body["scores"][1] < body["scores"][0]


async def test_health_readiness_and_info(client: httpx.AsyncClient) -> None:
    assert (await client.get("/healthz")).json() == {"status": "ok"}
    ready = (await client.get("/readyz")).json()
    assert ready["ready"] is True and ready["redis"] == "disabled"
    info = (await client.get("/info")).json()
    assert info["model"]["name"] == "tiny-int8"
    assert info["index"]["replies"] == len({r for _, r in PAIRS} | set(REPLY_ONLY))
    assert info["index"]["queries"] == len(PAIRS)
    assert info["index"]["version"] == ready["index_version"]
    sessions = info["model"]["encoder_sessions"]  # the choice made at load, with its figures and the CPU
    assert sessions["lone_request_session"] in sessions["p50_ms"] and set(sessions["cpu"]) == {"model", "vnni"}


async def test_without_an_index_the_service_is_alive_but_not_ready(make_client, tmp_path) -> None:  # type: ignore[no-untyped-def]
    async with make_client(artifacts_dir=tmp_path) as client:
        assert (await client.get("/healthz")).status_code == 200
        ready = await client.get("/readyz")
        assert ready.status_code == 503 and ready.json()["ready"] is False
        response = await client.post("/reply", json={"context": ["hi"]})
        assert response.status_code == 503
        assert response.json()["error"]["kind"] == "not_ready"


async def test_in_process_sessions_keep_context_and_do_not_repeat(client: httpx.AsyncClient) -> None:
    first = (await client.post("/reply", json={"session_id": "local-1", "message": "my cat is sick"})).json()
    second = (await client.post("/reply", json={"session_id": "local-1", "message": "my cat is sick"})).json()
    assert first["session_id"] == "local-1"
    assert second["reply"] != first["reply"]


async def test_an_uncalibrated_model_says_where_its_thresholds_come_from(client: httpx.AsyncClient) -> None:
    info = (await client.get("/info")).json()
    model, index = info["model"], info["index"]
    assert model["calibration"] == {} and model["thresholds_from"].startswith("not calibrated")
    profile = index["profile"]
    assert 0 < profile["query_neighbour_p50"] <= profile["query_neighbour_p99"] <= 1
    assert model["thresholds"]["query_similarity"] == profile["query_neighbour_p99"]
    assert model["reaction_fallback"].startswith("off")  # the tiny bundle has no reactions
    assert model["reaction_sets"] == []


async def test_with_one_stored_query_and_no_calibration_query_similarity_is_off(
    make_client: AppFactory, tmp_path: Path
) -> None:
    # One stored query has no neighbour to set a threshold from; the untrained 0.7 would let it answer
    # every turn a zero-shot encoder finds vaguely alike.
    async with make_client(artifacts_dir=tmp_path, admin_token=TOKEN) as client:
        job = await upload(client, [{"query": "my cat is sick", "reply": "oh no"}, {"reply": "lol"}], mode="replace")
        assert job["state"] == "succeeded", job
        info = (await client.get("/info")).json()["model"]
        answer = (await client.post("/reply", json={"context": ["my cat is sick"]})).json()
    assert info["thresholds"]["query_similarity"] > 1  # above any cosine, and still a JSON number
    assert info["thresholds_from"].startswith("not calibrated: query similarity off")
    assert answer["source"] == "reply_matching"  # not even the stored query itself answers by query similarity


def test_the_cache_folds_case_only_for_a_model_that_does(artifacts: Path) -> None:
    runtime = build_runtime(settings_for(artifacts))
    lowercases = runtime.current().encoder.lowercases
    assert lowercases  # the tiny bundle's WordPiece lower-cases: "Hi" and "hi" are one input, and one key
    assert runtime.cache.key("m", "context", "Hi", lowercases) == runtime.cache.key("m", "context", "hi", lowercases)
    assert runtime.cache.key("m", "context", "Hi", False) != runtime.cache.key("m", "context", "hi", False)


@pytest.mark.parametrize(("spin", "entry"), [(False, "0"), (True, "1")])
def test_the_spin_setting_reaches_the_encoder_session(artifacts: Path, spin: bool, entry: str) -> None:
    options = build_runtime(settings_for(artifacts, ort_spin=spin)).current().encoder.session.get_session_options()
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == entry
    # Spinning or not, no pool thread goes on spinning once a run has returned.
    assert options.get_session_config_entry("session.force_spinning_stop") == "1"


def spinning(encoder: Encoder) -> bool:
    return encoder.session.get_session_options().get_session_config_entry("session.intra_op.allow_spinning") == "1"


def test_a_lone_request_runs_on_the_session_that_measured_faster_and_a_batch_on_a_sleeping_one(
    artifacts: Path,
) -> None:
    encoder = build_runtime(settings_for(artifacts)).current().encoder
    choice = encoder.alone_choice
    assert set(choice["p50_ms"]) == {"sleeping", "spinning"} and all(v > 0 for v in choice["p50_ms"].values())
    faster = min(choice["p50_ms"], key=choice["p50_ms"].get)
    assert choice["lone_request_session"] == faster
    lone = encoder.for_batch(1)
    assert spinning(lone) == (faster == "spinning") and (lone is encoder) == (faster == "sleeping")
    assert encoder.for_batch(2) is encoder and not spinning(encoder)


def test_the_spinning_sibling_shares_the_tokenizers_and_gives_the_same_vectors(artifacts: Path) -> None:
    encoder = build_runtime(settings_for(artifacts)).current().encoder
    sibling = encoder.sibling(spin=True)
    assert spinning(sibling) and sibling.tokenizers is encoder.tokenizers
    rows, outputs = encoder.tokenize(["hi! how are you?"], "context"), [OUTPUT_NAMES["context"]]
    assert np.array_equal(sibling.run_ids(rows, outputs)[0], encoder.run_ids(rows, outputs)[0])  # one graph


@pytest.mark.parametrize("overrides", [{"ort_spin_alone": False}, {"ort_spin": True}])
def test_no_second_session_when_it_is_off_or_every_session_spins(artifacts: Path, overrides: dict[str, bool]) -> None:
    encoder = build_runtime(settings_for(artifacts, **overrides)).current().encoder
    assert encoder.alone is None and encoder.for_batch(1) is encoder and not encoder.alone_choice
