"""A shallow student initialised from alternate teacher layers (DistilBERT,
Small-BERT): it starts close to the teacher, so distillation has less to do."""

from __future__ import annotations

import copy
from collections.abc import Sequence

from transformers import BertModel

from models.encoder import DualEncoder


def student_from(teacher: DualEncoder, keep_layers: Sequence[int]) -> DualEncoder:
    config = copy.deepcopy(teacher.body.config)
    config.num_hidden_layers = len(keep_layers)
    body = BertModel(config, add_pooling_layer=False)
    body.embeddings.load_state_dict(teacher.body.embeddings.state_dict())
    for target, source in zip(body.encoder.layer, keep_layers, strict=True):
        target.load_state_dict(teacher.body.encoder.layer[source].state_dict())
    student = DualEncoder(body)
    if teacher.context_head is not None:
        student.add_heads()
        assert student.context_head is not None and student.reply_head is not None
        assert teacher.reply_head is not None
        student.context_head.load_state_dict(teacher.context_head.state_dict())
        student.reply_head.load_state_dict(teacher.reply_head.state_dict())
    return student
