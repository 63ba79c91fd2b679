"""Tokenised torch batches for training, and the order they come in.

Training tokenises exactly as serving does (same tokenizer.json, same
truncation side per text kind), so the model learns the inputs it will see.
The order is a pure function of the seed and the step, so a run resumed from
a checkpoint sees the same batches it would have seen without stopping.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer

from core.encoder import cut_context, pad, prefix_length


class Tokenise:
    def __init__(
        self, tokenizer_path: Path, max_context_tokens: int, max_reply_tokens: int, context_prefix: str = ""
    ) -> None:
        self.context = Tokenizer.from_file(str(tokenizer_path))
        # Contexts keep their most recent turns: cut from the left, as serving does.
        self.context.enable_truncation(max_length=max_context_tokens, direction="left")
        self.context.enable_padding(pad_id=0, pad_token="[PAD]")
        self.max_context_tokens = max_context_tokens
        self.context_head = 0
        if context_prefix:
            # A plain left cut would take the query prefix first; cut as serving does
            # (core/encoder.py): whole, then between the prefix and the oldest turn.
            self.context.no_truncation()
            self.context.no_padding()
            self.context_head = prefix_length(self.context, context_prefix)
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
        """[B, T] ids and mask. Texts carry the context prefix already, when there is one."""
        if not self.context_head:
            return self._tensors(self.context, texts)
        encodings = self.context.encode_batch(list(texts))
        ids, mask = pad([cut_context(e.ids, self.context_head, self.max_context_tokens) for e in encodings])
        return torch.from_numpy(ids), torch.from_numpy(mask)

    def replies(self, texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        return self._tensors(self.reply, texts)


class BatchPlan:
    """Row indices of each step's batch, epoch after epoch.

    Within a batch no reply repeats (a duplicate would be a false negative
    for its twin: the corpus has many "lol"s); a row whose reply is already
    in the batch waits for the next one. Rows are drawn in groups of
    `length_group` batches and sorted by length inside a group, so a batch
    pads to a length close to its rows'; the batches of an epoch are then
    shuffled, so that length does not follow the step.
    """

    def __init__(
        self, reply_keys: Sequence[str], lengths: Sequence[int], batch_size: int, length_group: int, seed: int
    ) -> None:
        if len(reply_keys) != len(lengths):
            raise ValueError("one length per row")
        self.reply_keys = list(reply_keys)
        self.lengths = np.asarray(lengths)  # [N]
        self.batch_size = batch_size
        self.length_group = max(1, length_group)
        self.seed = seed
        self._cached: tuple[int, list[list[int]]] | None = None
        self.per_epoch = len(self.epoch(0))

    def epoch(self, epoch: int) -> list[list[int]]:
        # One read and one write of the cache: a step tokenised ahead on another
        # thread (models/live_student.py) may ask for the next epoch meanwhile.
        cached = self._cached
        if cached is None or cached[0] != epoch:
            cached = (epoch, self._plan(epoch))
            self._cached = cached
        return cached[1]

    def _plan(self, epoch: int) -> list[list[int]]:
        rng = np.random.default_rng((self.seed, epoch))
        order = rng.permutation(len(self.reply_keys)).tolist()
        group_rows = self.batch_size * self.length_group
        batches: list[list[int]] = []
        waiting: list[int] = []
        for start in range(0, len(order), group_rows):
            group = waiting + order[start : start + group_rows]
            group.sort(key=lambda row: int(self.lengths[row]))
            batch: list[int] = []
            seen: set[str] = set()
            waiting = []
            for row in group:
                key = self.reply_keys[row]
                if key in seen:
                    waiting.append(row)
                    continue
                batch.append(row)
                seen.add(key)
                if len(batch) == self.batch_size:
                    batches.append(batch)
                    batch, seen = [], set()
            waiting += batch  # a partial batch joins the next group
        return [batches[i] for i in rng.permutation(len(batches))]

    def batch(self, step: int) -> list[int]:
        if self.per_epoch == 0:
            raise ValueError(f"fewer distinct replies than one batch of {self.batch_size}")
        batches = self.epoch(step // self.per_epoch)
        # Waiting rows can make a later epoch a batch shorter than the first.
        return batches[(step % self.per_epoch) % len(batches)]

    def steps(self, epochs: float) -> int:
        return max(1, round(epochs * self.per_epoch))
