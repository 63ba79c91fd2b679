"""MiniLM with new Korean rows (models/minilm/script_student.py): the pieces it adds, a
tokenizer that reads English as MiniLM's does, and a student whose English is MiniLM's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer

from core.bundle import TOKENIZER_FILE
from models.encoder import mean_pool, minilm_path
from models.minilm.script_student import ScriptStudent, check_english, extend_tokenizer, korean_pieces
from tests.training.tiny_bert import tiny

pytestmark = pytest.mark.training

ENGLISH = [
    "Hello there, how are you doing today?",
    "I can't believe it's already Thursday... café crème, naïve résumé!",
    "My wife left me today [SEP] oh no, I'm so sorry",
]


def test_korean_pieces_are_spelt_as_wordpiece_spells_words_and_cover_every_syllable_they_hold() -> None:
    e5 = {"▁": 0, "▁안녕": 1, "하세요": 2, "▁hello": 3, "요": 4, "▁가": 5}
    pieces = korean_pieces(e5, minilm_vocab={"[UNK]": 0, "hello": 1, "가": 2})
    assert pieces["안녕"] == [1] and pieces["##하세요"] == [2] and pieces["##요"] == [4]
    # Syllables of longer pieces, as words and as continuations; a syllable MiniLM has is its own.
    assert {"안", "##안", "녕", "##녕", "하", "##하", "세", "##세", "##가"} <= set(pieces)
    assert "가" not in pieces and "hello" not in pieces and "##" not in pieces
    assert pieces["##가"] == [5]  # e5 has only the word start: it starts the continuation too


def test_korean_pieces_come_in_e5_id_order_whatever_order_the_vocabulary_comes_in() -> None:
    """Their order is the new rows' ids: a tokenizer's get_vocab() order changes with each process."""
    e5 = {"▁": 0, "▁안녕": 1, "하세요": 2, "▁hello": 3, "요": 4, "▁가": 5, "▁친구": 6, "세": 7}
    minilm = {"[UNK]": 0, "hello": 1, "가": 2}
    pieces = list(korean_pieces(e5, minilm).items())
    assert list(korean_pieces(dict(reversed(e5.items())), minilm).items()) == pieces
    assert [spelling for spelling, _ in pieces[:4]] == ["안녕", "##하세요", "##요", "친구"]


def test_the_extended_tokenizer_reads_english_as_minilm_does_and_korean_without_unk(tmp_path: Path) -> None:
    minilm = minilm_path() / TOKENIZER_FILE
    e5 = {"▁": 0, "▁안녕": 1, "하세요": 2, "▁친구": 3, "야": 4}
    pieces = korean_pieces(e5, Tokenizer.from_file(str(minilm)).get_vocab())
    extended = tmp_path / TOKENIZER_FILE
    extend_tokenizer(minilm, list(pieces), extended)
    check_english(minilm, extended, ENGLISH)
    tokens = [t for t in Tokenizer.from_file(str(extended)).encode("안녕하세요 친구야").tokens if t != "[PAD]"]
    assert tokens == ["[CLS]", "안녕", "##하세요", "친구", "##야", "[SEP]"]
    # MiniLM's own normaliser takes Hangul apart into jamo; ours puts it back together.
    assert Tokenizer.from_file(str(minilm)).encode("안녕").tokens[1:4] == ["ᄋ", "##ᅡ", "##ᆫ"]


def test_check_english_names_a_text_that_tokenises_differently(tmp_path: Path) -> None:
    minilm = minilm_path() / TOKENIZER_FILE
    extended = tmp_path / TOKENIZER_FILE
    extend_tokenizer(minilm, ["hellothere"], extended)  # a Latin piece would change English
    with pytest.raises(ValueError, match="Hellothere"):
        check_english(minilm, extended, ["Hellothere friend"])


def test_the_student_reads_old_ids_as_the_body_does_and_trains_only_the_new_rows() -> None:
    body, _ = tiny(vocab_size=50)
    student = ScriptStudent(body, torch.randn(4, body.config.hidden_size))  # ids 50..53 are new
    ids = torch.tensor([[1, 5, 7, 0], [2, 3, 0, 0]])  # [B, T]
    mask = (ids > 0).long()
    with torch.no_grad():
        hidden = body(input_ids=ids, attention_mask=mask).last_hidden_state  # [B, T, D]
        expected = torch.nn.functional.normalize(mean_pool(hidden, mask), dim=-1)
        assert torch.allclose(student(ids, mask), expected, atol=1e-5)
    student(torch.tensor([[1, 51, 52]]), torch.ones(1, 3, dtype=torch.long)).sum().backward()
    assert [name for name, p in student.named_parameters() if p.grad is not None] == ["korean_rows"]
    assert student.korean_rows.grad is not None
    assert student.korean_rows.grad[1].abs().sum() > 0 and student.korean_rows.grad[0].abs().sum() == 0


def test_the_minilm_bundle_serves_minilms_english_rows_and_its_korean_rows_can_be_read_back(tmp_path: Path) -> None:
    from core.bundle import RELEASE_ROOT, read_manifest
    from models.encoder import load_pretrained
    from models.minilm.script_student import ROWS_FILE, rows_from_bundle, served_word_rows

    minilm_bundle = RELEASE_ROOT / "minilm"  # the shipped bundle this student made
    table, step = served_word_rows(minilm_bundle)  # [V + K, D]
    minilm = load_pretrained().body.embeddings.word_embeddings.weight.detach().numpy()  # [V, D]
    assert np.abs(table[: len(minilm)] - minilm).max() <= step / 2 + 1e-6
    rows_from_bundle(minilm_bundle, tmp_path)
    rows = np.load(tmp_path / ROWS_FILE)  # [K, D]
    assert rows.shape == (len(table) - len(minilm), minilm.shape[1])
    assert read_manifest(minilm_bundle).training["new_pieces"] == len(rows)
    assert (tmp_path / TOKENIZER_FILE).read_bytes() == (minilm_bundle / TOKENIZER_FILE).read_bytes()


def test_a_rebuild_is_compared_with_the_release_piece_by_piece_not_id_by_id(tmp_path: Path) -> None:
    import json
    import shutil

    from core.bundle import RELEASE_ROOT
    from models.minilm.script_student import compare

    release = RELEASE_ROOT / "minilm"
    same = compare(release, release)
    assert same["same_pieces"] and same["pieces_at_another_id"] == 0 and same["english_rows_equal"]
    assert same["row_cosine"]["min"] == pytest.approx(1.0) and same["int8_codes_equal"] == 1.0
    # Two new pieces that trade ids, their rows left in place: each now names the other's row.
    rebuilt = tmp_path / "rebuilt"
    shutil.copytree(release, rebuilt)
    spec = json.loads((rebuilt / TOKENIZER_FILE).read_text(encoding="utf-8"))
    vocab = spec["model"]["vocab"]
    first, second = (p for p, i in vocab.items() if i in (len(vocab) - 2, len(vocab) - 1))
    vocab[first], vocab[second] = vocab[second], vocab[first]
    (rebuilt / TOKENIZER_FILE).write_text(json.dumps(spec, ensure_ascii=False), encoding="utf-8")
    swapped = compare(rebuilt, release)
    assert swapped["same_pieces"] and swapped["pieces_at_another_id"] == 2 and swapped["english_rows_equal"]
    assert swapped["row_cosine"]["min"] < 0.99 and swapped["int8_codes_equal"] < 1.0


def test_translated_korean_maps_to_the_chitchat_turns_it_translates_and_nothing_else_does() -> None:
    import json

    from index.corpus import load_conversations
    from models.minilm.script_student import english_originals
    from models.written_korean import TRANSLATED

    row = json.loads(TRANSLATED.read_text(encoding="utf-8").splitlines()[0])
    original = {c.id: c for c in load_conversations()}[row["source"]].turns[row["start"] :]
    two_turns = "\n".join(row["turns"][:2])
    found = english_originals(
        [row["turns"][1], two_turns, "안녕하세요 처음 뵙겠습니다", row["turns"][0] + "\n안녕"], "\n", " [SEP] "
    )
    assert found == [original[1], f"{original[0]} [SEP] {original[1]}", None, None]
