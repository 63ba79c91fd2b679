"""Tokenised torch batches for training, with the serving tokenizer.

Training tokenises exactly as serving does (same tokenizer.json, same
truncation side per text kind), so the model learns the inputs it will see.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from tokenizers import Tokenizer


class Tokenise:
    def __init__(self, tokenizer_path: Path, max_context_tokens: int, max_reply_tokens: int) -> None:
        self.context = Tokenizer.from_file(str(tokenizer_path))
        # Contexts keep their most recent turns: cut from the left, as serving does.
        self.context.enable_truncation(max_length=max_context_tokens, direction="left")
        self.context.enable_padding(pad_id=0, pad_token="[PAD]")
        self.reply = Tokenizer.from_file(str(tokenizer_path))
        self.reply.enable_truncation(max_length=max_reply_tokens, direction="right")
        self.reply.enable_padding(pad_id=0, pad_token="[PAD]")

    @staticmethod
    def _tensors(tokenizer: Tokenizer, texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        encodings = tokenizer.encode_batch(list(texts))
        ids = torch.tensor([e.ids for e in encodings], dtype=torch.long)  # [B, T]
        mask = torch.tensor([e.attention_mask for e in encodings], dtype=torch.long)  # [B, T]
        return ids, mask

    def contexts(self, texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        return self._tensors(self.context, texts)

    def replies(self, texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        return self._tensors(self.reply, texts)
