"""What the multilingual builder's tests share (tests/training/test_multilingual.py and
test_trained_layers.py): tiny random BERTs, the texts they check parity on, a tokenizer.
A helper module, not a test module."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import BertConfig, BertModel

from core.bundle import TOKENIZER_FILE
from models.e5_weights import BertShape, E5Weights
from models.encoder import minilm_path
from models.parallel import EXTRA, PARALLEL

TEXTS = [*PARALLEL["en"], *PARALLEL["ko"][:3], *EXTRA[-4:]]


def tiny(vocab_size: int, seed: int = 0) -> tuple[BertModel, E5Weights]:
    """A random 2-layer BERT and the same weights as the builder takes them."""
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=160,
        hidden_act="gelu",
        attn_implementation="eager",
    )
    body = BertModel(config, add_pooling_layer=False).eval()
    with torch.no_grad():  # LayerNorms away from 1 and 0, so a swapped weight/bias shows
        for p in body.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    shape = BertShape(32, 2, 4, 64, vocab_size, 160, 2, config.layer_norm_eps)
    tensors = {k: v.numpy().copy() for k, v in body.state_dict().items() if v.is_floating_point()}
    return body, E5Weights(shape, tensors)


def tokenizer_path() -> Path:
    # Any tokenizer exercises the mechanism; MiniLM's is small and always installed with the train extra.
    return minilm_path() / TOKENIZER_FILE
