"""Normalisation and the echo check."""

from __future__ import annotations

import random
import unicodedata

import pytest

from core.text import (
    MIN_WORDS_FOR_FUZZY,
    TRIGRAM_JACCARD,
    WORD_JACCARD,
    Signature,
    _jaccard,
    echoes,
    near_copy,
    normalize,
    script_of,
)


def test_normalize_folds_case_width_and_whitespace() -> None:
    assert normalize("  Hi\u3000THERE\n") == "hi there"
    assert normalize("ｈｅｌｌｏ") == "hello"  # full-width letters (NFKC)


def test_normalize_composes_hangul() -> None:
    decomposed = "\u1100\u1161\u11a8"  # ㄱ + ㅏ + ㄱ as conjoining jamo
    assert normalize(decomposed) == "각" == normalize("각")


def test_normalize_composes_nfd_syllables() -> None:
    assert normalize(unicodedata.normalize("NFD", "안녕하세요")) == "안녕하세요"


HALFWIDTH_KK = "\uffbb\uffbb"  # ㅋㅋ in halfwidth forms


@pytest.mark.parametrize("text", ["ㅋㅋ", "ㅠㅠ", "ㅇㅋ", "ㅋㅠㅠ", "ㅋㅋㅋ 진짜?", HALFWIDTH_KK])
def test_normalize_keeps_compatibility_jamo_as_typed(text: str) -> None:
    # NFKC alone would give conjoining jamo, and "ㅋㅠㅠ" -> "큐ᅲ": a syllable nobody typed.
    assert normalize(text) == text


def test_halfwidth_jamo_are_hangul() -> None:
    assert script_of([HALFWIDTH_KK]) == script_of(["ㅋㅋ"]) == "Hangul"


def test_normalize_still_folds_around_jamo() -> None:
    assert normalize("ｈｅｌｌｏ ㅋㅋ ﬁne") == "hello ㅋㅋ fine"


def test_normalize_can_keep_case() -> None:
    assert normalize(" Hi  ＴＨＥＲＥ ", lowercase=False) == "Hi THERE"


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("I love pizza so much", "i love pizza so much!!"),
        ("do you like dogs?", "Do you like dogs"),
        ("i'm from utah, you?", "I am from Utah. You?"),
        ("what are you doing this weekend", "what are you doing this weekend?? "),
        ("what r you doing this weekend", "what are you doing this weekend"),
        ("hi", "Hi!"),
    ],
)
def test_near_copies(a: str, b: str) -> None:
    assert near_copy(Signature.of(a), Signature.of(b))


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("hi", "hi there"),  # short lines: only identical ones are copies
        ("do you like dogs?", "do you like cats?"),
        ("i'm from utah", "i grew up in utah"),
        ("what are you doing this weekend", "nothing much this weekend, you?"),
        ("haha", "lol"),
    ],
)
def test_different_replies(a: str, b: str) -> None:
    assert not near_copy(Signature.of(a), Signature.of(b))


def test_echoes_checks_every_turn() -> None:
    turns = [Signature.of("where are you from?"), Signature.of("I just adopted a puppy!")]
    assert echoes("i just adopted a puppy", turns)
    assert not echoes("congrats! what breed?", turns)


def test_the_size_shortcut_never_changes_a_near_copy_verdict() -> None:
    """near_copy skips the set work when sizes rule a match out; it must agree with the plain rule."""
    rng = random.Random(0)
    vocab = ["i", "am", "from", "utah", "you", "do", "like", "dogs", "cats", "so", "ok"]

    def plain(a: Signature, b: Signature) -> bool:
        if a.words == b.words:
            return True
        if min(len(a.words), len(b.words)) < MIN_WORDS_FOR_FUZZY:
            return False
        words = len(set(a.words) & set(b.words)) / len(set(a.words) | set(b.words))
        return words >= WORD_JACCARD or _jaccard(a.trigrams, b.trigrams) >= TRIGRAM_JACCARD

    verdicts = set()
    for _ in range(5000):
        a, b = (Signature.of(" ".join(rng.choices(vocab, k=rng.randint(0, 9)))) for _ in range(2))
        assert near_copy(a, b) == plain(a, b), (a.words, b.words)
        verdicts.add(near_copy(a, b))
    assert verdicts == {True, False}
