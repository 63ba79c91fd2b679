"""The other languages of the multilingual fine-tune: ChatterBot's corpus cut
into pairs, kept apart from our Korean evaluation sets, and batched one
language at a time."""

from __future__ import annotations

import pytest

from core.text import normalize
from models.chatterbot import chatterbot_pairs, held_out_lines, language_pairs
from models.multilingual import BundleSpec
from models.multilingual_tune import OtherLanguages, TuneConfig
from models.written_korean import TRANSLATED, WRITTEN, written_korean_pairs

pytestmark = pytest.mark.training


def test_each_turn_answers_up_to_three_before_it_and_held_out_lines_stay_out() -> None:
    turns = [["a", "b", "c", "d", "e"]]
    pairs = language_pairs(turns, 3, " | ", held_out=set())
    assert pairs.contexts == ["a", "a | b", "a | b | c", "b | c | d"]
    assert pairs.replies == ["b", "c", "d", "e"]
    kept = language_pairs(turns, 3, " | ", held_out={normalize("D")})
    assert kept.contexts == ["a", "a | b"]  # d as a reply or in a context: both out


def test_the_installed_corpus_brings_korean_and_no_line_we_judge_on() -> None:
    found = chatterbot_pairs(3, " | ", 64)
    assert "english" not in found and len(found["korean"]) > 600
    held_out = held_out_lines()
    assert len(held_out) > 600  # both sets were read
    for pairs in found.values():
        lines = {normalize(t) for c in pairs.contexts for t in c.split(" | ")} | set(pairs.reply_keys)
        assert not lines & held_out


@pytest.fixture(scope="module")
def other() -> OtherLanguages:
    return OtherLanguages(TuneConfig(multilingual_every=4, korean_share=0.25, chatterbot=True), BundleSpec())


def test_every_fourth_step_is_one_language_and_the_same_on_a_rerun(other: OtherLanguages) -> None:
    assert [other.takes(s) for s in range(8)] == [False, False, False, True] * 2
    contexts, replies = other.batch(3)
    assert len(contexts) == len(replies) == 64 and (contexts, replies) == other.batch(3)
    assert all(c.startswith("query: ") for c in contexts) and all(r.startswith("passage: ") for r in replies)
    unprefixed = {r.removeprefix("passage: ") for r in replies}
    assert sum(unprefixed <= set(p.replies) for p in other.pairs.values()) >= 1  # all from one language


def test_korean_takes_its_share_of_the_other_language_steps(other: OtherLanguages) -> None:
    korean = set(other.pairs["korean"].replies)
    steps = [s for s in range(4000) if other.takes(s)]  # 1,000 batches
    share = sum({r.removeprefix("passage: ") for r in other.batch(s)[1]} <= korean for s in steps) / len(steps)
    assert 0.2 < share < 0.3


def test_english_only_reads_no_other_corpus() -> None:
    english = OtherLanguages(TuneConfig(multilingual_every=0), BundleSpec())
    assert not english.pairs and not any(english.takes(s) for s in range(100))


def test_by_default_the_other_language_batches_are_our_korean_and_no_chatterbot() -> None:
    """chatterbot-corpus is the out-of-domain dev set: its folders translate its English one."""
    default = OtherLanguages(TuneConfig(), BundleSpec())
    assert list(default.pairs) == ["korean"] and default.weights == [1.0]
    ours = written_korean_pairs(3, " | ", WRITTEN) + written_korean_pairs(3, " | ", TRANSLATED)
    assert default.pairs["korean"] == ours
    assert [default.takes(s) for s in range(8)] == ([False] * 3 + [True]) * 2  # every 4th: the tracked run's
