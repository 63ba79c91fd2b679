"""Reaction sets uploaded with the candidates, each for its own language."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import httpx
import numpy as np
import pytest

from app.engine.runtime import build_runtime
from core.bundle import REACTIONS_FILE, ReactionSpec
from core.mood import TurnReading
from core.reactions import ReactionClassifier
from core.retriever import Avoid, ReactionSet, reaction
from core.retriever import conversation_script as script
from tests.helpers import AUTH, TOKEN, AppFactory, settings_for, upload

pytestmark = pytest.mark.anyio

KOREAN = [
    {"query": "오늘 뭐 했어?", "reply": "친구랑 영화 봤어", "id": "ko-1"},
    {"query": "배고프다", "reply": "나도! 피자 먹을래?", "id": "ko-2"},
    {"reply": "ㅋㅋㅋ", "id": "ko-laugh", "kind": "reaction", "language": "ko"},
    {"reply": "헐 대박", "id": "ko-wow", "kind": "reaction", "language": "ko"},
]
UNSURE = {"thresholds": {"query_similarity": 1.0, "reply_matching": 1.0}}  # nothing retrieved is sure enough


@pytest.fixture
async def korean_client(make_client: AppFactory, artifacts: Path, tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    own = tmp_path / "artifacts"
    shutil.copytree(artifacts, own)
    async with make_client(artifacts_dir=own, admin_token=TOKEN) as client:
        job = await upload(client, KOREAN)
        assert job["state"] == "succeeded", job
        yield client


async def test_a_korean_conversation_falls_back_to_the_uploaded_korean_reactions(
    korean_client: httpx.AsyncClient,
) -> None:
    korean = (await korean_client.post("/reply", json={"context": ["나 오늘 시험 망했어"], **UNSURE})).json()
    assert korean["source"] == "reaction" and korean["id"] in ("ko-laugh", "ko-wow")
    # The tiny model has no reaction set of its own, and none was uploaded for English: no fallback there.
    english = (await korean_client.post("/reply", json={"context": ["i failed my exam today"], **UNSURE})).json()
    assert english["source"] == "reply_matching"


async def test_reactions_are_never_retrieved_as_replies(korean_client: httpx.AsyncClient) -> None:
    body = {"context": ["ㅋㅋㅋ 진짜?"], "strategies": ["query_similarity", "reply_matching"], "k": 50}
    answer = (await korean_client.post("/reply", json=body)).json()
    assert {"ㅋㅋㅋ", "헐 대박"}.isdisjoint(c["text"] for c in answer["candidates"])


async def test_a_reaction_needs_a_known_language_and_no_query(korean_client: httpx.AsyncClient) -> None:
    for record, field in [
        ({"reply": "lol", "kind": "reaction"}, "record 1"),
        ({"reply": "lol", "kind": "reaction", "language": "klingon"}, "record 1.language"),
        ({"reply": "lol", "kind": "reaction", "language": "en", "query": "funny?"}, "record 1"),
    ]:
        response = await korean_client.post("/admin/candidates", json=[record], headers=AUTH)
        assert response.status_code == 422 and response.json()["error"]["field"] == field, response.text


async def test_a_turn_without_letters_is_read_with_the_whole_window(korean_client: httpx.AsyncClient) -> None:
    after_korean = {"context": ["나 오늘 시험 망했어", "😭😭"], **UNSURE}
    assert (await korean_client.post("/reply", json=after_korean)).json()["source"] == "reaction"
    # No letters anywhere: the English tiny bundle's language decides, and no Latin-script set was uploaded.
    only_emoji = (await korean_client.post("/reply", json={"context": ["😭😭", "?!"], **UNSURE})).json()
    assert only_emoji["source"] == "reply_matching"


async def test_a_multilingual_bundle_assumes_no_language_for_a_window_without_letters(
    korean_client: httpx.AsyncClient, tmp_path: Path
) -> None:
    """A Korean deployment of the multilingual bundle with an English set of its own: "😭" gets
    neither the English set nor the Korean one; any letters in the window pick one of them."""
    serving = build_runtime(settings_for(tmp_path / "artifacts")).current()  # the fixture's upload
    english = ReactionClassifier(["lol"], np.zeros((1, serving.encoder.dim), np.float32), np.zeros(1, np.float32), "en")
    korean = replace(serving, bundle=replace(serving.bundle, language="mul"), reactions=english)
    assert korean.reaction_sets() == [ReactionSet("model", "en", 1), ReactionSet("upload", "ko", 2)]
    assert not korean.reactions_apply(script(["😭", "?!"]))
    hangul, latin = script(["시험 망했어", "😭"]), script(["i failed my exam", "😭"])
    assert len(korean.uploaded_reactions(hangul)) == 2 and korean.classifier_language(script(["시험 망했어"])) is None
    assert korean.classifier_language(latin) is not None and not len(korean.uploaded_reactions(script(["i failed"])))
    # An English bundle reads a window without letters as English.
    assert replace(korean, bundle=serving.bundle).classifier_language(script(["😭"])) is not None


async def test_info_lists_every_reaction_set_and_when_the_fallback_answers(korean_client: httpx.AsyncClient) -> None:
    model = (await korean_client.get("/info")).json()["model"]
    assert model["reactions"] is None  # the tiny model has none of its own
    assert model["reaction_sets"] == [{"source": "upload", "language": "ko", "count": 2}]
    fallback = model["reaction_fallback"]
    assert fallback.startswith("on for conversations in Hangul script, off for others")
    assert "without letters gets none" in fallback and "sets a reply_matching threshold" in fallback


def test_the_bundles_own_classes_answer_in_each_language_they_are_written_in(tmp_path: Path, artifacts: Path) -> None:
    """A multilingual bundle's reaction classes with their Korean text: a Korean conversation gets the
    Korean text of the class an English one would get, and a Japanese one gets none of them."""
    serving = build_runtime(settings_for(artifacts)).current()
    dim = serving.encoder.dim
    weight = np.zeros((2, dim), np.float32)
    classifier = ReactionClassifier(
        ["haha", "oh no"], weight, np.array([0.0, 1.0], np.float32), "en", {"ko": ["ㅋㅋㅋ", "헐"]}
    )
    multilingual = replace(serving, bundle=replace(serving.bundle, language="mul"), reactions=classifier)
    vector = np.zeros(dim, np.float32)
    avoid = Avoid.of(["x"])
    for turn, answer in [("i failed my exam", ["oh no"]), ("나 시험 망했어", ["헐"]), ("試験に落ちた", [])]:
        reading = TurnReading(turn, multilingual.reactions, vector)
        assert [h.text for h in reaction(multilingual, reading, vector, 1, avoid, script([turn]))] == answer
    assert multilingual.reaction_sets()[:2] == [ReactionSet("model", "en", 2), ReactionSet("model", "ko", 2)]
    np.savez(tmp_path / REACTIONS_FILE, weight=weight, bias=np.zeros(2, np.float32))
    spec = ReactionSpec(labels=["haha", "oh no"], coverage=0.1, translations={"ko": ["ㅋㅋㅋ"]})
    with pytest.raises(ValueError, match="1 ko reactions for 2 classes"):
        ReactionClassifier.load(tmp_path, spec)


def test_a_class_that_takes_a_side_answers_only_a_context_that_leans_its_way(tmp_path: Path, artifacts: Path) -> None:
    """ "that's awesome!" is the classifier's favourite, but the context leans to bad news on the
    valence axis: the class that takes no side answers. Below the margin neither side may."""
    dim = 4
    classifier = ReactionClassifier(
        ["that's awesome!", "oh no", "oh I see"],
        np.zeros((3, dim), np.float32),
        np.array([2.0, 1.0, 0.0], np.float32),  # "that's awesome!" first on probability alone
        "en",
        axes=np.array([[1.0, 0.0, 0.0, 0.0]], np.float32),  # valence: + good news, - bad
        axis_of=np.array([0, 0, -1]),
        pole=np.array([1.0, -1.0, 0.0], np.float32),
        margin=0.1,
    )
    bad_news = np.array([-0.5, 0.0, 0.0, 0.0], np.float32)
    unsure = np.array([0.05, 0.0, 0.0, 0.0], np.float32)
    good_news = np.array([0.5, 0.0, 0.0, 0.0], np.float32)
    assert [c for c, _ in classifier.top(bad_news, 3)] == [1, 2]
    assert [c for c, _ in classifier.top(unsure, 3)] == [2]
    assert [c for c, _ in classifier.top(good_news, 3)] == [0, 2]

    # A bundle's spec names the axes by their anchor lines; the bundle's encoder places them.
    serving = build_runtime(settings_for(artifacts)).current()
    np.savez(tmp_path / REACTIONS_FILE, weight=np.zeros((2, serving.encoder.dim), np.float32), bias=np.zeros(2))
    spec = ReactionSpec(
        labels=["congrats!", "oh no"],
        coverage=0.1,
        stances=["valence+", "valence-"],
        axes={"valence": [["I won the lottery"], ["my dog died"]]},
        stance_margin=0.0,
    )
    with pytest.raises(ValueError, match="needs the bundle's encoder"):
        ReactionClassifier.load(tmp_path, spec)
    loaded = ReactionClassifier.load(tmp_path, spec, serving.encoder)
    won = serving.encoder.encode(["I won the lottery"], side="context")[0]
    assert loaded.axes.shape == (1, serving.encoder.dim)
    assert [c for c, _ in loaded.top(won, 2)] == [0]
    with pytest.raises(ValueError, match="names no axis"):
        ReactionClassifier.load(tmp_path, replace(spec, stances=["valence+", "tone-"]), serving.encoder)
