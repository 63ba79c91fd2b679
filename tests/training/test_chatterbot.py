"""ChatterBot's corpus cut into pairs, kept apart from our Korean evaluation sets. No recipe
trains on it (its folders translate its English one, an out-of-domain dev set: models/ood.py);
`language_pairs` cuts our written Korean too (models/written_korean.py)."""

from __future__ import annotations

import pytest

from core.text import normalize
from models.chatterbot import chatterbot_pairs, held_out_lines, language_pairs

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
