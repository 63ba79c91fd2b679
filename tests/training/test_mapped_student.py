"""MiniLM's layers over e5's tokens (models/mapped_student.py): the shared words, the
least-squares map, and a student that reads through it."""

from __future__ import annotations

import pytest
import torch

from models.mapped_student import MappedStudent, fit_map, shared_words
from tests.training.tiny_bert import tiny

pytestmark = pytest.mark.training


def test_shared_words_pair_word_starts_and_continuations_as_wordpiece_spells_them() -> None:
    student = {"▁hello": 0, "▁Hello": 1, "ing": 2, "▁": 3, "s": 4, "▁zzq": 5, "▁a": 6}
    minilm = {"hello": 10, "##ing": 11, "##s": 12, "[UNK]": 13, "a": 14}
    # A cased piece finds no uncased word; a bare "▁" and one-letter words are left out.
    assert sorted(shared_words(student, minilm)) == [(0, 10), (2, 11), (4, 12)]


def test_the_map_recovers_a_linear_relation_between_the_tables() -> None:
    torch.manual_seed(0)
    source = torch.randn(200, 8)  # [N, De]
    truth = torch.randn(8, 6)  # [De, D]
    assert torch.allclose(fit_map(source, source @ truth), truth, atol=1e-4)


def test_a_student_reads_mapped_rows_as_the_body_reads_its_own_embeddings() -> None:
    body, _ = tiny(vocab_size=50)
    words = body.embeddings.word_embeddings.weight.detach().clone()  # [V, D]
    student = MappedStudent(words, body, torch.eye(words.shape[1]))
    ids = torch.tensor([[1, 5, 7, 0], [2, 3, 0, 0]])  # [B, T]
    mask = (ids > 0).long()
    with torch.no_grad():
        hidden = body(input_ids=ids, attention_mask=mask).last_hidden_state  # [B, T, D]
        expected = torch.nn.functional.normalize((hidden * mask[..., None]).sum(1) / mask.sum(1, keepdim=True), dim=-1)
        assert torch.allclose(student(ids, mask), expected, atol=1e-5)
    # Only the map is the student's own: the frozen table is not saved with it.
    assert "e5_words" not in student.state_dict() and student.word_map.requires_grad
