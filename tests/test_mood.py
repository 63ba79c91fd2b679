"""Never cheer bad news: the valence model (core/valence.py), a side taken only when sure, and the mood
guard that passes over a stored reply of the opposite clear side, from any strategy (core/mood.py)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import core.retriever as retriever
from app.engine.runtime import build_runtime
from core.bundle import ConfidenceSpec, Thresholds, ValenceSpec, open_bundle
from core.confidence import ConfidenceModel
from core.encoder import Encoder
from core.mood import MoodGuard, TurnReading, reply_moods
from core.reactions import ReactionClassifier
from core.records import Candidate
from core.retriever import STRATEGY_ORDER, Avoid, Scored, WalkRequest, distinct, walk
from core.store import IndexStore
from core.valence import Valence, gram_ids
from index.build import build_version
from tests.helpers import bundle_of, settings_for

DIM = 4
SPEC = ValenceSpec(bits=16, orders=[2, 3], words=True, sure=[1.0, 2.0], reply_sure=[1.0, 2.0])
# word -> its weight. "좋다" alone (6 n-grams) reads 3.7 / sqrt(6) = 1.5: between the scripts' margins.
WORDS = {"great": 40.0, "congrats": 40.0, "좋다": 3.7, "fired": -40.0, "died": -40.0, "잘렸어": -40.0}


def word_valence(vector_weight: float = 0.0, dim: int = DIM) -> Valence:
    """A valence model that knows a few words (WORDS; the features are at unit length). Korean turns
    lean on the n-grams alone; others on the vector too, by `vector_weight`."""
    grams = np.zeros(1 << SPEC.bits, np.float32)
    for word, weight in WORDS.items():
        grams[gram_ids(word, ValenceSpec(bits=SPEC.bits, orders=[], words=True))] = weight
    stack = np.array([[1.0, vector_weight, 0.0], [1.0, 0.0, 0.0]], np.float32)
    vector = np.zeros(dim, np.float32)
    vector[0] = 1.0
    return Valence(SPEC, grams, 0.0, vector, 0.0, stack, digest="words")


def classifier(valence: Valence | None = None) -> ReactionClassifier:
    """ "that's awesome!" first on probability alone, "oh no" on the other side, "oh I see" on none."""
    plain = ReactionClassifier(
        ["that's awesome!", "oh no", "oh I see"],
        np.zeros((3, DIM), np.float32),
        np.array([2.0, 1.0, 0.0], np.float32),
        "en",
        axes=np.array([[1.0, 0.0, 0.0, 0.0]], np.float32),  # valence: + good news, - bad
        axis_of=np.array([0, 0, -1]),
        pole=np.array([1.0, -1.0, 0.0], np.float32),
        margin=0.1,
        axis_names=["valence"],
    )
    return plain.with_valence(valence) if valence is not None else plain


def test_a_side_is_taken_only_past_the_margin_and_a_question_is_never_good_news() -> None:
    valence = word_valence()
    anywhere = np.zeros(DIM, np.float32)
    assert valence.turn_side(valence.turn_lean("I got fired today", anywhere)) == -1
    assert valence.turn_side(valence.turn_lean("오늘 회사에서 잘렸어", anywhere)) == -1
    assert valence.turn_side(valence.turn_lean("that is great news", anywhere)) == 1
    assert valence.turn_side(valence.turn_lean("I went for a walk", anywhere)) == 0
    assert valence.turn_log_odds("is it great?", anywhere) <= 0.0  # asking, not telling
    assert valence.turn_side(valence.turn_lean("got fired?", anywhere)) == -1  # bad news may ask
    replies = ["congrats!", "oh no, who died", "ok", "great?"]
    assert valence.reply_sides(replies, valence.reply_log_odds(replies)).tolist() == [1, -1, 0, 0]


def test_each_script_takes_a_side_at_its_own_margin() -> None:
    valence = word_valence()
    korean = valence.turn_log_odds("좋다", np.zeros(DIM, np.float32))
    assert 1.0 < korean < 2.0  # past the margin of a turn without Hangul, short of the Korean one
    assert valence.turn_side(valence.turn_lean("좋다", np.zeros(DIM, np.float32))) == 0
    assert valence.reply_sides(["좋다"], np.array([korean], np.float32)).tolist() == [0]


def test_each_script_leans_on_its_own_weights() -> None:
    valence = word_valence(vector_weight=10.0)
    cheerful_vector = np.array([1.0, 0, 0, 0], np.float32)  # the reader's "good news" direction
    assert valence.turn_log_odds("I went for a walk", cheerful_vector) == pytest.approx(10.0)
    assert valence.turn_log_odds("산책했어", cheerful_vector) == pytest.approx(0.0, abs=1e-6)  # row 1: n-grams only


def test_the_valence_file_keeps_only_the_weights_it_needs() -> None:
    valence = word_valence(vector_weight=2.0)
    arrays = valence.to_arrays()
    assert len(arrays["gram_rows"]) == np.count_nonzero(valence.grams) < len(valence.grams)
    again = Valence.from_arrays(SPEC, arrays, "words")
    np.testing.assert_array_equal(again.grams, valence.grams.astype(np.float16).astype(np.float32))  # as stored
    np.testing.assert_array_equal(again.stack, valence.stack)
    with pytest.raises(ValueError, match="outside"):
        Valence.from_arrays(SPEC, {**arrays, "gram_rows": np.array([1 << SPEC.bits], np.int32)})


def test_with_a_valence_model_the_reactions_take_a_side_by_its_log_odds() -> None:
    served = classifier(word_valence())
    anywhere = np.array([5.0, 0, 0, 0], np.float32)  # the old axis would call this good news
    assert [c for c, _ in served.top(anywhere, 3, valence=-1.5)] == [1, 2]  # sure bad news: sympathy
    assert [c for c, _ in served.top(anywhere, 3, valence=0.5)] == [2]  # unsure: neither side
    assert [c for c, _ in served.top(anywhere, 3, valence=1.0)] == [0, 2]
    with pytest.raises(ValueError, match="pass its lean"):
        served.top(anywhere, 3)  # a caller that forgets the valence model is caught, not served the old axis


def hits(texts: list[str]) -> list[Scored]:
    return [Scored(row, f"r{row}", text, 1.0 - row / 10, "reply_matching") for row, text in enumerate(texts)]


def test_bad_news_passes_over_cheerful_replies_and_good_news_over_sad_ones() -> None:
    valence = word_valence()
    served = classifier(valence)
    replies = ["congrats, that is great!", "oh no, who died", "what happened?"]
    sides = valence.reply_sides(replies, valence.reply_log_odds(replies))
    assert sides.tolist() == [1, -1, 0]
    for turn, kept in (
        ("I got fired today", ["oh no, who died", "what happened?"]),
        ("오늘 회사에서 잘렸어", ["oh no, who died", "what happened?"]),
        ("my talk went great", ["congrats, that is great!", "what happened?"]),
        ("I went for a walk", replies),
    ):
        guard = MoodGuard(sides, TurnReading(turn, served, np.zeros(DIM, np.float32)))
        assert [h.text for h in distinct(hits(replies), 3, Avoid(mood=guard))] == kept, turn


def test_the_turn_is_read_only_when_a_hit_takes_a_side() -> None:
    class Counting(TurnReading):
        reads = 0

        def lean(self) -> float | None:
            Counting.reads += 1
            return super().lean()

    reading = Counting("I got fired today", classifier(word_valence()), np.zeros(DIM, np.float32))
    guard = MoodGuard(np.zeros(3, np.int8), reading)
    assert [h.text for h in distinct(hits(["a", "b", "c"]), 3, Avoid(mood=guard))] == ["a", "b", "c"]
    assert Counting.reads == 0
    assert reading.side() == -1 and Counting.reads == 1


def test_the_build_scores_each_reply_once_and_the_version_keeps_it(tmp_path: Path, artifacts: Path) -> None:
    bundle_dir = bundle_of(artifacts)
    bundle = open_bundle(bundle_dir)
    store = IndexStore(tmp_path / "indexes")
    replies = ["congrats, that is great!", "oh no, who died", "see you tomorrow"]
    valence = word_valence()
    manifest = build_version(
        [Candidate(reply=r) for r in replies],
        Encoder(bundle_dir, bundle),
        bundle.checksum,
        store,
        "t",
        progress=False,
        valence=valence,
    )
    loaded = store.load(manifest.version)
    assert loaded.reply_valence is not None and loaded.reply_valence[0] == "words"
    want = valence.reply_sides(loaded.reply_texts, valence.reply_log_odds(loaded.reply_texts))
    np.testing.assert_array_equal(reply_moods(loaded, valence), want)
    assert sorted(want.tolist()) == [-1, 0, 1]
    # Scored by another model (or not at all): scored again as it loads, from the texts.
    other = Valence(valence.spec, -valence.grams, 0.0, valence.vector, 0.0, valence.stack, digest="other")
    np.testing.assert_array_equal(reply_moods(loaded, other), -want)


def served_head(dim: int) -> ReactionClassifier:
    """`classifier`'s three reactions at a served encoder's width, reading valence by WORDS alone."""
    return ReactionClassifier(
        ["that's awesome!", "oh no", "oh I see"],
        np.zeros((3, dim), np.float32),
        np.array([2.0, 1.0, 0.0], np.float32),
        "en",
        axes=np.zeros((1, dim), np.float32),
        axis_of=np.array([0, 0, -1]),
        pole=np.array([1.0, -1.0, 0.0], np.float32),
        axis_names=["valence"],
    ).with_valence(word_valence(dim=dim))


def test_no_strategy_serves_a_cheerful_reply_to_sure_bad_news(artifacts: Path) -> None:
    """Every stored reply but one marked cheerful: to "I got fired today" the walk serves that one or a
    reaction, whichever strategy found it; to a neutral turn the guard passes everything."""
    serving = build_runtime(settings_for(artifacts)).current()
    dim = serving.encoder.dim
    head = served_head(dim)
    index = replace(serving.index)  # this test's own copy: the moods are set on it
    index.reply_moods = np.ones(len(index.reply_texts), np.int8)
    keep = len(index.reply_texts) // 2
    index.reply_moods[keep] = 0
    guarded = replace(serving, index=index, reactions=head)
    for turn in ("I got fired today", "tell me about your day"):
        vector = serving.encoder.encode([turn], side="context")[0]
        request = WalkRequest(
            window=[turn],
            allowed=list(STRATEGY_ORDER),
            k=3,
            thresholds=Thresholds(query_similarity=-1.0, reply_matching=-1.0),  # any hit is confident
            avoid=Avoid.of([turn]),
            query_vector=vector,
            context_vector=vector,
            poly_vectors=None,
            script="Latin",
        )
        answer = walk(guarded, request)
        assert answer is not None
        if turn.startswith("I got fired"):
            assert all(h.reply_row in (keep, -1) for h in answer.candidates), answer.candidates
        else:
            assert answer.best.reply_row not in (keep, -1)  # the guard passed every reply through


def test_the_guard_holds_back_cheer_before_a_turn_is_sure_bad_news() -> None:
    held = replace(word_valence(), spec=replace(SPEC, hold_cheer=[0.3, 0.3], hold_sympathy=[1.0, 1.0]))
    assert held.turn_side(-0.5) == 0  # no reaction takes sympathy's side yet ...
    assert held.guarded_side("it went badly", -0.5) == -1  # ... but no cheerful reply answers it
    assert held.guarded_side("it went well", 0.5) == 0  # sympathy is held back only from sure good news
    assert held.guarded_side("it went well", 1.0) == 1


def test_only_the_hits_served_read_the_turn_and_the_confidence_reads_them_all_as_fitted(
    artifacts: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reply that takes a side below the k served costs no read of the turn; one within them
    does, and is passed over for the next hit. The confidence features read the hits before the
    guard, as models/walk.py fits them, so passing a reply over does not move the confidence."""
    serving = build_runtime(settings_for(artifacts)).current()
    dim = serving.encoder.dim
    reads: list[str] = []

    class Counting(TurnReading):
        def lean(self) -> float | None:
            reads.append(self.turn)
            return super().lean()

    head = served_head(dim)
    turn = "I got fired today"
    vector = serving.encoder.encode([turn], side="context")[0]
    request = WalkRequest(
        window=[turn],
        allowed=["reply_matching"],
        k=2,
        thresholds=Thresholds(query_similarity=-1.0, reply_matching=-1.0),
        avoid=Avoid.of([turn]),
        query_vector=None,
        context_vector=vector,
        poly_vectors=None,
        script="Latin",
    )
    # A confidence that reads the second hit's score: it moves if the guard's choice reaches it.
    spread = ConfidenceModel(ConfidenceSpec(["margin"], [0.0], [1.0], [1.0], 0.0, [i / 100 for i in range(101)], 0.7))
    serving = replace(serving, confidence=spread, share=None)
    plain = walk(replace(serving, reactions=head), request)
    assert plain is not None and len(plain.candidates) == 2 and plain.confidence is not None
    rows = [h.reply_row for h in plain.candidates]
    monkeypatch.setattr(retriever, "TurnReading", Counting)

    def walked(moods: np.ndarray) -> tuple[list[int], float | None]:
        index = replace(serving.index)
        index.reply_moods = moods
        answer = walk(replace(serving, index=index, reactions=head), request)
        assert answer is not None
        return [h.reply_row for h in answer.candidates], answer.confidence

    cheerful_elsewhere = np.ones(len(serving.index.reply_texts), np.int8)
    cheerful_elsewhere[rows] = 0  # the two served take no side; every other reply is cheerful
    assert walked(cheerful_elsewhere) == (rows, plain.confidence)
    assert reads == []
    cheerful_first = np.zeros(len(serving.index.reply_texts), np.int8)
    cheerful_first[rows[0]] = 1
    served_rows, confidence = walked(cheerful_first)
    assert reads and served_rows[0] == rows[1] and rows[0] not in served_rows
    assert confidence == plain.confidence
