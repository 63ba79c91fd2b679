"""A torch model judged in process on the out-of-domain floors: chatterbot-corpus English and Korean
(R@1 and R@10, every distinct reply a candidate) and the STS dev sets (Spearman x 100). A training
run reads it before and after; the release reads the live API's figures (bench/ood.py) instead."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from scipy.stats import spearmanr
from transformers import BertModel

from models.encoder import mean_pool
from models.ood import ReplySet, StsSet, available_sts, chatterbot_set, sts_set

Encode = Callable[[list[str], bool], torch.Tensor]  # texts, as contexts? -> [N, D] unit rows


def pooled(body: BertModel, tokens: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    ids, mask = tokens  # [B, T] each
    hidden = body(input_ids=ids, attention_mask=mask).last_hidden_state  # [B, T, D]
    return F.normalize(mean_pool(hidden, mask), dim=-1)  # [B, D]


@torch.no_grad()
def encode_all(encode: Encode, texts: list[str], context: bool, batch: int = 256) -> torch.Tensor:
    return torch.cat([encode(texts[i : i + batch], context) for i in range(0, len(texts), batch)])  # [N, D]


def reply_r_at(encode: Encode, replies: ReplySet, separator: str) -> dict[str, float]:
    contexts = encode_all(encode, [separator.join(c) for c in replies.contexts], True)  # [C, D]
    candidates = encode_all(encode, replies.replies, False)  # [N, D]
    top = torch.topk(contexts @ candidates.T, k=10, dim=1).indices  # [C, 10]
    hits = [[replies.hit(c, replies.replies[int(j)]) for j in row] for c, row in enumerate(top)]
    return {
        "r_at_1": round(float(np.mean([row[0] for row in hits])), 4),
        "r_at_10": round(float(np.mean([any(row) for row in hits])), 4),
        "contexts": len(replies.contexts),
        "candidates": len(replies.replies),
    }


def sts_spearman(encode: Encode, sts: StsSet) -> float:
    # Both sides as the context side reads them: /similar embeds pairs so ("query: " for e5).
    a = encode_all(encode, [p[0] for p in sts.pairs], True)  # [P, D]
    b = encode_all(encode, [p[1] for p in sts.pairs], True)  # [P, D]
    return round(100 * float(spearmanr((a * b).sum(-1).numpy(), sts.gold).statistic), 1)


def judge(encode: Encode, separator: str) -> dict[str, Any]:
    figures: dict[str, Any] = {
        f"chatterbot_{language}": reply_r_at(encode, chatterbot_set(language), separator) for language in ("en", "ko")
    }
    figures.update({name: sts_spearman(encode, sts_set(name)) for name in available_sts()})
    return figures
