"""The reaction fallback: the table that maps emotions to reactions, the gates that keep a reaction
from being wrong, and the shipped bundles' heads (docs/reactions.md). No torch."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from core.bundle import REACTIONS_FILE, RELEASE_ROOT, ReactionSpec, open_bundle
from core.encoder import Encoder
from core.reactions import ReactionClassifier
from models.reactions.classes import (
    CLASS_NAMES,
    EMOTION_LABELS,
    FALLBACK,
    KINDS,
    MIRRORS,
    NEVER_UNSURE,
    REACTION_CLASSES,
    STANCE_AXES,
    text_kind,
    text_valence,
    verdict,
)

ROOT = Path(__file__).resolve().parents[1]
LABELLED = ROOT / "bench" / "data" / "reactions_labelled.jsonl"
# The encoders' own heads, and the reaction model that answers for them (it reads the turn as they do).
SHIPPED = [RELEASE_ROOT / "e5", RELEASE_ROOT / "minilm", RELEASE_ROOT / "reactions"]
C = len(CLASS_NAMES)
FALLBACK_ROW = CLASS_NAMES.index(FALLBACK)


def trains(source: str, label: str) -> str:
    """The class a text with this one label teaches."""
    return KINDS[text_kind(source, [label])].trains


def test_the_table_maps_each_emotion_to_the_reaction_the_issue_names() -> None:
    assert trains("goemotions", "grief") == trains("goemotions", "sadness") == "sympathy"
    assert {trains("goemotions", e) for e in ("joy", "pride", "relief")} <= {"congrats", "great"}
    assert trains("goemotions", "gratitude") == "welcome"
    assert trains("goemotions", "amusement") == "laugh"
    assert trains("goemotions", "surprise") == trains("goemotions", "curiosity") == "really"
    assert trains("kote", "슬픔") == "sympathy" and trains("kote", "고마움") == "welcome"
    assert text_kind("nsmc", ["negative"]) == "" and text_valence("nsmc", ["negative"]) == -1  # polarity only


def test_a_text_is_of_one_kind_only_when_its_labels_agree() -> None:
    assert text_kind("goemotions", ["sadness", "joy"]) == ""  # two kinds
    assert text_kind("goemotions", ["joy", "anger"]) == ""  # good news whose labels lean both ways
    assert text_kind("goemotions", ["joy", "admiration"]) == "good_news"  # the other label only agrees
    assert text_kind("goemotions", ["neutral", "realization"]) == ""  # a statement is neutral alone
    for source, table in EMOTION_LABELS.items():
        for label, (kind, valence) in table.items():
            assert kind in ("", *KINDS) and valence in (-1, 0, 1), (source, label)


def test_every_kind_trains_a_class_that_fits_it() -> None:
    for name, kind in KINDS.items():
        assert kind.trains in CLASS_NAMES and kind.fits <= set(CLASS_NAMES), name
        assert verdict(name, kind.trains) == "fits", name


def test_the_fallback_fits_almost_anything_and_is_never_amazed_nor_a_mirror() -> None:
    fallback = next(c for c in REACTION_CLASSES if c.name == FALLBACK)
    assert fallback.role == "fallback" and not fallback.stance
    assert set(fallback.surface.values()).isdisjoint(NEVER_UNSURE)
    assert all(verdict(kind, FALLBACK) != "wrong" for kind in KINDS)
    # No class says "wow" or "우와" any more; "me too!" and "you too!" are mirrors, and only mirrors.
    surfaces = {s for c in REACTION_CLASSES for s in c.surface.values()}
    assert not surfaces & {"wow", "우와"}
    assert {c.name for c in REACTION_CLASSES if set(c.surface.values()) & NEVER_UNSURE} == MIRRORS


def test_a_mirror_fits_only_the_turn_that_invites_it() -> None:
    assert [k for k in KINDS if verdict(k, "me_too") != "wrong"] == ["liking"]
    assert [k for k in KINDS if verdict(k, "you_too") != "wrong"] == ["wish"]


def test_the_issues_examples_are_wrong_and_sympathy_fits_them() -> None:
    # "my dog died this morning" -> "wow" was "great"'s kin; "나 시험 떨어졌어" -> "나도!".
    for served in ("great", "congrats", "cool", "laugh", "really", "me_too", "you_too", "good_luck"):
        assert verdict("bad_news", served) == "wrong", served
    assert verdict("bad_news", "sympathy") == "fits" and verdict("bad_news", FALLBACK) == "neutral"
    assert verdict("good_news", "sympathy") == "wrong"  # a contradiction
    assert verdict("joke", "hello") == "wrong" and verdict("greeting", "bye") == "wrong"  # the phase, contradicted


def test_the_labelled_set_is_large_enough_and_says_where_each_line_came_from() -> None:
    rows = [json.loads(line) for line in LABELLED.read_text(encoding="utf-8").splitlines() if line.strip()]
    for language in ("en", "ko"):
        mine = [r for r in rows if r["language"] == language]
        assert len(mine) >= 150, language
        assert {r["half"] for r in mine} == {"A", "B"}
        assert any(r["source"] == "written" for r in mine) and any(r["source"].endswith(":test") for r in mine)
    for r in rows:
        assert r["category"] in KINDS
        assert r["source"] == "written" or (r["source"].endswith(":test") and r["id"] and r["labels"])
        if r["source"] != "written":  # an outside line's kind is its labels' kind through the table
            assert text_kind(r["source"].split(":")[0], r["labels"]) == r["category"], r
    assert len({(r["language"], r["text"]) for r in rows}) == len(rows)
    triggers = ROOT / "models" / "data" / "reaction_triggers.jsonl"
    trained = {json.loads(line)["text"] for line in triggers.read_text(encoding="utf-8").splitlines() if line}
    assert trained.isdisjoint(r["text"] for r in rows)  # no line the head learned from is judged


def spec(**changes: object) -> ReactionSpec:
    """The table's classes with learned valence and phase axes, every class sure at 0.5, mirrors at 0.9."""
    floors = [0.0 if n == FALLBACK else 0.9 if n in MIRRORS else 0.5 for n in CLASS_NAMES]
    base = ReactionSpec(
        labels=[c.surface["en"] for c in REACTION_CLASSES],
        coverage=0.0,
        translations={"ko": [c.surface["ko"] for c in REACTION_CLASSES]},
        stances=[c.stance for c in REACTION_CLASSES],
        axes={name: [list(plus), list(minus)] for name, (plus, minus) in STANCE_AXES.items()},
        margins={"valence": 1.0, "phase": 0.0},
        floors=floors,
        guards={"valence-": 2.0},
        fallback=FALLBACK_ROW,
    )
    return replace(base, **changes)  # type: ignore[arg-type]


DIM = 4  # a context: [valence lean, phase lean, which class, unused]


def arrays(favourite: str, strength: float = 10.0) -> dict[str, np.ndarray]:
    """A linear head whose probabilities follow a context's third number toward `favourite`, axes that
    read the first (valence, log-odds) and second (phase) numbers."""
    weight = np.zeros((C, DIM), np.float32)  # [C, D]
    weight[CLASS_NAMES.index(favourite), 2] = strength
    return {
        "weight": weight,
        "bias": np.zeros(C, np.float32),
        "axes": np.array([[1, 0, 0, 0], [0, 1, 0, 0]], np.float32),  # [A, D] in STANCE_AXES order
        "axis_bias": np.zeros(2, np.float32),
    }


def context(valence: float, sure: float, phase: float = 0.0) -> np.ndarray:
    return np.array([valence, phase, sure, 0.0], np.float32)  # [D]


def served(favourite: str, ctx: np.ndarray, **changes: object) -> list[str]:
    classifier = ReactionClassifier.from_arrays(spec(**changes), arrays(favourite))
    return [CLASS_NAMES[c] for c, _ in classifier.top(ctx, C)]


def test_a_turn_nothing_is_sure_about_gets_the_fallback_alone() -> None:
    for favourite in CLASS_NAMES:
        assert served(favourite, context(valence=0.0, sure=0.0)) == [FALLBACK]  # flat: 1/16 each


def test_a_sure_class_answers_first_and_the_fallback_stands_behind_it() -> None:
    assert served("welcome", context(valence=0.5, sure=1.0)) == ["welcome", FALLBACK]


def test_a_mirror_answers_only_past_its_own_higher_floor() -> None:
    assert served("me_too", context(valence=0.0, sure=0.4)) == [FALLBACK]  # p 0.78: sure enough for another class
    assert served("me_too", context(valence=0.0, sure=1.0))[0] == "me_too"  # p 0.9995


def test_a_class_takes_a_side_only_where_the_turn_leans_its_way() -> None:
    assert served("sympathy", context(valence=-1.5, sure=1.0))[0] == "sympathy"
    assert served("sympathy", context(valence=-0.5, sure=1.0)) == [FALLBACK]  # leans bad, by less than the margin
    assert served("great", context(valence=1.5, sure=1.0))[0] == "great"
    assert served("great", context(valence=-1.5, sure=1.0)) == [FALLBACK]
    assert served("hello", context(valence=0.0, sure=1.0, phase=-0.1)) == [FALLBACK]  # a farewell: no "hi!"


def test_bad_news_is_answered_only_with_sympathy_or_the_fallback() -> None:
    # "good luck!" takes no side, but a turn that leans to bad news by the guard gets none of it.
    assert served("good_luck", context(valence=-3.0, sure=1.0)) == [FALLBACK]
    assert served("good_luck", context(valence=-1.0, sure=1.0))[0] == "good_luck"  # short of the guard
    assert served("good_luck", context(valence=-3.0, sure=1.0), guards={})[0] == "good_luck"


def test_an_older_spec_answers_as_it_did() -> None:
    """No floors, no fallback, no guard: every allowed class, likeliest first (the bundles before)."""
    old = spec(floors=[], fallback=-1, guards={}, margins={})
    classifier = ReactionClassifier.from_arrays(old, arrays("welcome"))
    top = [CLASS_NAMES[c] for c, _ in classifier.top(context(valence=-1.0, sure=1.0), C)]
    assert top[0] == "welcome" and set(CLASS_NAMES) - set(top) == {"congrats", "great", "cool"}  # leaning bad


def test_answers_agree_with_what_top_serves_first() -> None:
    rng = np.random.default_rng(0)
    raw = arrays("sympathy")
    raw["weight"] = rng.normal(size=(C, DIM)).astype(np.float32)
    classifier = ReactionClassifier.from_arrays(spec(), raw)
    contexts = rng.normal(scale=2.0, size=(200, DIM)).astype(np.float32)  # [N, D]
    assert classifier.answers(contexts).tolist() == [classifier.top(c, C)[0][0] for c in contexts]


def test_a_head_with_a_hidden_layer_reads_as_the_same_softmax() -> None:
    rng = np.random.default_rng(1)
    raw = arrays("sympathy")
    raw["hidden_weight"] = rng.normal(size=(8, DIM)).astype(np.float32)  # [H, D]
    raw["hidden_bias"] = rng.normal(size=8).astype(np.float32)  # [H]
    raw["weight"] = rng.normal(size=(C, 8)).astype(np.float32)  # [C, H]
    probs = ReactionClassifier.from_arrays(spec(), raw).probabilities(rng.normal(size=(5, DIM)).astype(np.float32))
    assert probs.shape == (5, C) and np.allclose(probs.sum(axis=1), 1.0)


def test_a_bundle_whose_head_does_not_match_its_spec_is_refused(tmp_path: Path) -> None:
    raw: dict[str, Any] = arrays("sympathy")
    np.savez(tmp_path / REACTIONS_FILE, **raw)
    assert ReactionClassifier.load(tmp_path, spec()).fallback == FALLBACK_ROW  # learned axes: no encoder needed
    for bad, match in [
        (spec(floors=[0.5] * 3), "3 floors"),
        (spec(fallback=C), "names no class"),
        (spec(guards={"tone-": 1.0}), "no axis"),
        (spec(axes={"valence": [[], []]}, stances=[""] * C), "2 axes for the spec's 1"),
    ]:
        with pytest.raises(ValueError, match=match):
            ReactionClassifier.load(tmp_path, bad)


@pytest.mark.parametrize("bundle", SHIPPED, ids=lambda b: b.name)
def test_the_shipped_bundles_answer_with_the_tables_classes_and_gates(bundle: Path) -> None:
    manifest = open_bundle(bundle)  # the head's checksum, as the manifest records it
    spec = manifest.reactions
    assert spec is not None
    assert spec.labels == [c.surface["en"] for c in REACTION_CLASSES]
    assert spec.translations == {"ko": [c.surface["ko"] for c in REACTION_CLASSES]}
    assert spec.fallback == FALLBACK_ROW and spec.floors[FALLBACK_ROW] == 0.0
    others = [f for n, f in zip(CLASS_NAMES, spec.floors, strict=True) if n not in MIRRORS and n != FALLBACK]
    assert all(spec.floors[CLASS_NAMES.index(m)] >= 0.5 for m in MIRRORS)
    assert min(others) > 0.0  # every class but the fallback must be sure
    record = manifest.training["reactions"]
    assert record["gates"]["half_a_wrong"] == 0  # the rule the recipe chose by
    classifier = ReactionClassifier.load(bundle, spec)  # its axes ship learned: no encoder needed
    assert classifier.labels_in("ko")[classifier.fallback] == "아 그렇구나"


# The issue's examples, through each shipped bundle's own encoder and head.
ISSUE_TURNS = [
    "my dog died this morning",
    "we broke up yesterday",
    "할머니가 돌아가셨어",
    "우리 헤어졌어",
    "나 시험 떨어졌어",
]


@pytest.mark.parametrize("bundle", SHIPPED, ids=lambda b: b.name)
def test_the_issues_examples_get_no_cheer_no_wow_and_no_mirror(bundle: Path) -> None:
    manifest = open_bundle(bundle)
    assert manifest.reactions is not None
    encoder = Encoder(bundle, manifest)
    classifier = ReactionClassifier.load(bundle, manifest.reactions, encoder)
    for turn in ISSUE_TURNS:
        first = CLASS_NAMES[classifier.top(encoder.encode([turn], side="context")[0], C)[0][0]]
        assert verdict("bad_news", first) != "wrong", (turn, first)
