"""Poly rerank, the reaction fallback and per-request thresholds, on a tiny bundle that has both."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import numpy as np
import pytest

from app.engine.runtime import build_runtime
from app.main import create_app
from core.bundle import PolySpec
from core.reranker import PolyReranker
from models.evalset import reranked_ranks
from tests.helpers import REACTION_LABELS, loaded, settings_for

pytestmark = pytest.mark.anyio


@pytest.mark.training
def test_numpy_rerank_computes_the_poly_encoders_score() -> None:
    """Against the poly-encoder's score (Humeau et al. 2020) written in torch: each reply attends over
    the m context vectors, and its cosine to what it attended to is mixed with the bi-encoder's."""
    import torch
    import torch.nn.functional as F

    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(4, 8)).astype(np.float32)  # [m, D]
    replies = rng.normal(size=(6, 8)).astype(np.float32)  # [K, D]
    replies /= np.linalg.norm(replies, axis=1, keepdims=True)
    bi = rng.uniform(-1, 1, size=6).astype(np.float32)  # [K]
    weight = float(torch.sigmoid(torch.tensor(0.3)))
    v, r = torch.from_numpy(vectors), torch.from_numpy(replies)
    attention = (r @ v.T).softmax(dim=-1)  # [K, m]
    poly = (F.normalize(attention @ v, dim=-1) * r).sum(dim=-1)  # [K]
    expected = (1 - weight) * torch.from_numpy(bi) + weight * poly  # [K]
    served = PolyReranker(PolySpec(codes=4, weight=weight)).rescore(vectors, bi, replies)
    np.testing.assert_allclose(served, expected.numpy(), atol=1e-5)


@pytest.mark.training
def test_reranked_rank_only_reorders_the_top_depth() -> None:
    bi = np.array([[0.5, 0.9, 0.8, 0.1], [0.2, 0.9, 0.8, 0.7]])  # true reply is column 0
    final = np.array([[0.99, 0.1, 0.1, 0.1], [0.99, 0.1, 0.1, 0.1]])
    # Row 0: bi rank 3, inside depth 3, rerank lifts it to 1. Row 1: bi rank 4, outside, stays 4.
    assert reranked_ranks(bi, bi, depth=3).tolist() == [3, 4]
    assert reranked_ranks(bi, final, depth=3).tolist() == [1, 4]


@asynccontextmanager
async def poly_client(artifacts: Path, **overrides: object) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings_for(artifacts, rerank_depth=20, **overrides))
    async with app.router.lifespan_context(app):
        await loaded(app)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            yield client


async def test_rerank_orders_the_faiss_top_k_by_the_poly_score(poly_artifacts: Path) -> None:
    context = ["have you seen any good movies lately?", "my cat is sick"]
    runtime = build_runtime(settings_for(poly_artifacts))
    serving = runtime.current()
    vector, poly_vectors = serving.encoder.encode_with_poly(
        [serving.encoder.join_context(context)]
    )  # [1, D], [1, m, D]
    scores, rows = serving.index.reply_index.search(vector, 20)  # exact search on a tiny index
    keep = rows[0] >= 0  # fewer than 20 replies: FAISS pads with -1
    scores, rows = scores[:, keep], rows[:, keep]
    expected_scores = serving.reranker.rescore(poly_vectors[0], scores[0], serving.index.reply_vectors(rows[0]))
    expected = [serving.index.reply_texts[r] for r in rows[0][np.argsort(-expected_scores, kind="stable")]]
    faiss_order = [serving.index.reply_texts[r] for r in rows[0]]
    assert expected != faiss_order  # the head does move things, or this test would prove nothing

    body = {"context": context, "strategies": ["reply_matching"], "k": 10}
    async with poly_client(poly_artifacts) as client:
        reranked = (await client.post("/reply", json={**body, "rerank": True})).json()
        plain = (await client.post("/reply", json=body)).json()  # off by default: Settings.rerank_by_default
        assert (await client.get("/info")).json()["model"]["rerank_by_default"] is False
    async with poly_client(poly_artifacts, rerank_by_default=True) as client:
        by_default = (await client.post("/reply", json=body)).json()
        assert (await client.get("/info")).json()["model"]["rerank_by_default"] is True
    assert reranked["reranked"] is True and by_default["reranked"] is True
    assert by_default["candidates"] == reranked["candidates"]
    assert [c["text"] for c in reranked["candidates"]] == expected[:10]
    assert [c["score"] for c in reranked["candidates"]] == sorted(
        (c["score"] for c in reranked["candidates"]), reverse=True
    )
    assert plain["reranked"] is False
    assert [c["text"] for c in plain["candidates"]] == faiss_order[:10]


async def test_unsure_reply_matching_falls_back_to_a_reaction(poly_artifacts: Path) -> None:
    # Not a stored query, so no cosine reaches 1.0; nor does a reranked score.
    body = {"context": ["my dog is unwell"], "thresholds": {"query_similarity": 1.0, "reply_matching": 1.0}}
    async with poly_client(poly_artifacts) as client:
        answer = (await client.post("/reply", json=body)).json()
        confident = (
            await client.post("/reply", json={**body, "thresholds": {"query_similarity": 1.0, "reply_matching": -1.0}})
        ).json()
    assert answer["source"] == "reaction"
    assert answer["reply"] in REACTION_LABELS
    assert answer["id"].startswith("reaction:")
    assert 0 < answer["score"] <= 1  # a class probability
    assert confident["source"] == "reply_matching"


async def test_a_low_query_threshold_lets_query_similarity_answer(poly_artifacts: Path) -> None:
    body = {"context": ["something nobody ever said"], "thresholds": {"query_similarity": -1.0}}
    async with poly_client(poly_artifacts) as client:
        answer = (await client.post("/reply", json=body)).json()
    assert answer["source"] == "query_similarity"


async def test_reactions_alone(poly_artifacts: Path) -> None:
    async with poly_client(poly_artifacts) as client:
        body = {"context": ["time for bed"], "strategies": ["reaction"], "k": 4}
        answer = (await client.post("/reply", json=body)).json()
        echo = (await client.post("/reply", json={**body, "context": ["Good night!"]})).json()
    assert answer["source"] == "reaction"
    assert sorted(c["text"] for c in answer["candidates"]) == sorted(REACTION_LABELS)
    assert abs(sum(c["score"] for c in answer["candidates"]) - 1) < 1e-4  # every class, so all the probability
    # A reaction is held to the echo rule too: never the user's own line back.
    assert "good night" not in [c["text"] for c in echo["candidates"]] and len(echo["candidates"]) == 3


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"thresholds": {"query_similarity": 1.5}}, "thresholds.query_similarity"),
        ({"thresholds": {"reply_matching": -2}}, "thresholds.reply_matching"),
        ({"thresholds": {"reply_matching": "high"}}, "thresholds.reply_matching"),
        ({"thresholds": {"reaction": 0.5}}, "thresholds.reaction"),
        ({"thresholds": [0.5]}, "thresholds"),
        ({"rerank": "yes please"}, "rerank"),
    ],
)
async def test_bad_overrides_are_rejected_naming_the_field(
    poly_artifacts: Path, body: dict[str, object], field: str
) -> None:
    async with poly_client(poly_artifacts) as client:
        response = await client.post("/reply", json={"context": ["hi"], **body})
    assert response.status_code == 422
    assert response.json()["error"]["field"] == field


async def test_asking_for_reactions_the_bundle_lacks_is_a_422(client: httpx.AsyncClient) -> None:
    # The plain tiny bundle has no reaction classifier, and no reactions were uploaded.
    response = await client.post("/reply", json={"context": ["hi"], "strategies": ["reaction"]})
    assert response.status_code == 422
    assert response.json()["error"]["field"] == "strategies"


async def test_rerank_on_a_bundle_without_a_poly_head_answers_without_it_and_says_so(
    client: httpx.AsyncClient,
) -> None:
    # A client that always asks for rerank keeps working when the release has no head (as now).
    body = {"context": ["have you seen any good movies lately?"], "strategies": ["reply_matching"], "k": 5}
    asked = await client.post("/reply", json={**body, "rerank": True})  # the plain tiny bundle
    plain = (await client.post("/reply", json=body)).json()
    info = (await client.get("/info")).json()
    assert asked.status_code == 200 and asked.json()["reranked"] is False
    assert asked.json()["candidates"] == plain["candidates"]
    assert info["model"]["poly"] is None


async def test_no_english_reaction_in_a_korean_conversation(poly_artifacts: Path) -> None:
    unsure = {"thresholds": {"query_similarity": 1.0, "reply_matching": 1.0}}  # every turn would go to a reaction
    async with poly_client(poly_artifacts) as client:
        english = (await client.post("/reply", json={"context": ["my dog is unwell"], **unsure})).json()
        korean = (await client.post("/reply", json={"context": ["우리 강아지가 아파요"], **unsure})).json()
        only_reactions = await client.post(
            "/reply", json={"context": ["우리 강아지가 아파요"], "strategies": ["reaction"]}
        )
        info = (await client.get("/info")).json()
    assert english["source"] == "reaction"
    assert korean["source"] == "reply_matching"  # the reaction set is English: the fallback is off here
    # The request is valid; no stored reaction speaks Korean: as a filter that admits nothing.
    assert only_reactions.status_code == 404 and only_reactions.json()["error"]["field"] == "strategies"
    assert info["model"]["reactions"]["language"] == "en" and "Latin" in info["model"]["reaction_fallback"]
