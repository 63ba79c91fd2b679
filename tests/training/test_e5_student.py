"""models/e5_student.py: how the student is cut from the teacher, and its relation loss."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from transformers import BertConfig, BertModel

from models.e5_student import StudentConfig, relation_distillation, student_weights
from models.e5_weights import BertShape, E5Weights, bert_body
from models.vocab import TrimmedVocabulary

pytestmark = pytest.mark.training


def teacher(layers: int = 4, vocab: int = 50) -> E5Weights:
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=vocab,
        hidden_size=16,
        num_hidden_layers=layers,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=40,
    )
    body = BertModel(config, add_pooling_layer=False)
    tensors = {k: v.numpy().copy() for k, v in body.state_dict().items() if v.is_floating_point()}
    shape = BertShape(16, layers, 2, 32, vocab, 40, 2, config.layer_norm_eps)
    pieces = [f"p{i}" for i in range(vocab)]
    return E5Weights(shape, tensors, pieces, np.arange(vocab, dtype=np.float32))


def test_the_student_is_the_teachers_chosen_layers_renumbered_under_the_kept_rows() -> None:
    full = teacher()
    rows = np.array([0, 1, 2, 3, 7, 19, 42])
    student = student_weights(full, (0, 2, 3), TrimmedVocabulary(rows, {}))
    assert student.shape.layers == 3 and student.shape.vocab == len(rows)
    for new, old in enumerate((0, 2, 3)):
        name = "attention.self.query.weight"
        np.testing.assert_array_equal(
            student.tensors[f"encoder.layer.{new}.{name}"], full.tensors[f"encoder.layer.{old}.{name}"]
        )
    assert not any(n.startswith("encoder.layer.3.") for n in student.tensors)
    embeddings = "embeddings.word_embeddings.weight"
    np.testing.assert_array_equal(student.tensors[embeddings], full.tensors[embeddings][rows])  # [V', H]
    assert student.pieces == [f"p{i}" for i in rows] and list(student.scores) == list(rows)
    bert_body(student)  # loads into a BertModel with nothing missing or left over


def test_the_relation_loss_is_zero_for_the_teachers_own_geometry_and_grows_away_from_it() -> None:
    torch.manual_seed(0)
    vectors = F.normalize(torch.randn(8, 16), dim=-1)  # [N, D]
    assert relation_distillation(vectors, vectors, 20.0, 20.0).item() < 1e-6
    shuffled = vectors[torch.randperm(8)]  # [N, D]: the same texts, related to the wrong others
    assert relation_distillation(shuffled, vectors, 20.0, 20.0).item() > 0.1


def test_the_release_student_keeps_the_teachers_first_and_last_layers() -> None:
    layers = StudentConfig.layers
    assert layers[0] == 0 and layers[-1] == 11 and list(layers) == sorted(set(layers))
