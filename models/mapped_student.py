"""MiniLM's layers over e5's multilingual tokens: does an input map keep MiniLM's English?

    python -m models.mapped_student --work artifacts/mapped             # the map alone, ~600 steps
    python -m models.mapped_student --work artifacts/mapped-l --train-layers
    python -m models.mapped_student --work artifacts/mapped --e5-only    # zero-shot e5 on the same protocol

Run 3 (docs/training.md) found that students built from e5's layers stay far
below all-MiniLM-L6-v2 on replies they never saw, whatever their English
targets. This asks the step before a student that starts from MiniLM's
geometry instead: all-MiniLM-L6-v2 reads English WordPiece; the pack's
trimmed e5 SentencePiece vocabulary reads English and Korean. The student is
e5's word embeddings (frozen), through a learned map into MiniLM's
word-embedding space, under MiniLM's own position and type embeddings,
LayerNorm and six layers. A mapped e5 row is just another embedding row, so
the student would export as an ordinary BERT over the trimmed vocabulary.

The map starts as the least-squares fit between the two embedding tables on
the words both vocabularies hold whole ("▁hello" and "hello"). Training:
1 - cosine to MiniLM's own vectors of the pack's English texts (chat turns,
WordNet glosses, prose), MiniLM reading its WordPiece and the student e5's
pieces. `--train-layers` trains MiniLM's layers too, at a tenth of the
map's rate. No Korean trains here: what the Korean rows show is what e5's
token embeddings carry through the map alone.

Judged in process, fp32, beside all-MiniLM-L6-v2 on the same protocol: the
out-of-domain sets of models/ood.py (chatterbot-corpus English and Korean,
every distinct reply a candidate, R@1 and R@10 per context; the STS dev
sets, Spearman x 100). They judge; nothing here trains or tunes on them.
Writes `run.json` in --work; a rerun resumes from the checkpoint there.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from scipy.stats import spearmanr
from torch import nn
from transformers import BertModel

from models.batches import Tokenise
from models.encoder import mean_pool
from models.live_student import WORD_EMBEDDINGS, Pack
from models.loop import run_steps
from models.ood import ReplySet, StsSet, available_sts, chatterbot_set, sts_set
from models.pack import MINILM_DIR, STUDENT_TOKENIZER

ENGLISH_POOLS = ("en-chat", "en-gloss", "en-prose")
Encode = Callable[[list[str], bool], torch.Tensor]  # texts, as contexts? -> [N, D] unit rows


@dataclass(frozen=True)
class MapConfig:
    steps: int = 600  # ~0.5 s a step on 2 cores: minutes, not hours
    batch_size: int = 64
    lr: float = 1e-3  # the map's; a 384 x 384 matrix moves little at BERT's usual 2e-5
    layer_lr_ratio: float = 0.1  # MiniLM's layers, with --train-layers: kept near what they know
    train_layers: bool = False
    max_tokens: int = 64
    warmup_fraction: float = 0.05
    seed: int = 0


def shared_words(student_vocab: dict[str, int], minilm_vocab: dict[str, int]) -> list[tuple[int, int]]:
    """(student id, MiniLM id) of pieces both vocabularies spell alike: a word start "▁x"
    is WordPiece's "x", a continuation "x" is its "##x". One-letter words ("▁a") are left out."""
    pairs = []
    for piece, student_id in student_vocab.items():
        word = piece[1:] if piece.startswith("▁") else "##" + piece
        if len(word) > 1 and word in minilm_vocab:
            pairs.append((student_id, minilm_vocab[word]))
    return pairs


def fit_map(source: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """[De, D] least-squares W with source @ W ~ target: source [N, De], target [N, D]."""
    return torch.linalg.lstsq(source, target).solution


class MappedStudent(nn.Module):
    def __init__(self, e5_words: torch.Tensor, body: BertModel, word_map: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("e5_words", e5_words, persistent=False)  # [V, De], frozen: the pack has it
        self.word_map = nn.Parameter(word_map)  # [De, D]
        self.body = body  # MiniLM: its own word embeddings are never read

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        # ids, mask: [B, T] -> [B, D] unit rows
        embedded = self.e5_words[ids] @ self.word_map  # [B, T, D]
        hidden = self.body(inputs_embeds=embedded, attention_mask=mask).last_hidden_state  # [B, T, D]
        return F.normalize(mean_pool(hidden, mask), dim=-1)


def pooled(body: BertModel, tokens: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    ids, mask = tokens  # [B, T] each
    hidden = body(input_ids=ids, attention_mask=mask).last_hidden_state  # [B, T, D]
    return F.normalize(mean_pool(hidden, mask), dim=-1)  # [B, D]


def english_texts(pack: Pack, seed: int) -> list[str]:
    texts = [t for pool in ENGLISH_POOLS for t in pack.texts.broad.get(pool, [])] + list(pack.texts.turns)
    random.Random(seed).shuffle(texts)
    return texts


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


def train(pack: Pack, cfg: MapConfig, work: Path) -> dict[str, Any]:
    torch.manual_seed(cfg.seed)
    teacher = pack.minilm_body().eval()
    teacher.requires_grad_(False)
    body = pack.minilm_body()
    body.requires_grad_(cfg.train_layers)
    student_tok = Tokenise(pack.folder / STUDENT_TOKENIZER, cfg.max_tokens, cfg.max_tokens)
    minilm_tok = Tokenise(pack.folder / MINILM_DIR / "tokenizer.json", cfg.max_tokens, cfg.max_tokens)
    e5_words = torch.from_numpy(pack.e5[WORD_EMBEDDINGS])  # [V, De]
    minilm_words = teacher.embeddings.word_embeddings.weight.detach()  # [V', D]
    pairs = shared_words(student_tok.reply.get_vocab(), minilm_tok.reply.get_vocab())
    source, target = (torch.tensor(ids) for ids in zip(*pairs, strict=True))
    word_map = fit_map(e5_words[source], minilm_words[target])  # [De, D]
    student = MappedStudent(e5_words, body, word_map)
    groups = [{"params": [student.word_map], "lr": cfg.lr}]
    if cfg.train_layers:
        groups.append({"params": list(body.parameters()), "lr": cfg.lr * cfg.layer_lr_ratio})
    optimizer = torch.optim.AdamW(groups, weight_decay=0.0)
    texts = english_texts(pack, cfg.seed)

    def encode_student(batch: list[str], context: bool) -> torch.Tensor:
        return student(*(student_tok.contexts if context else student_tok.replies)(batch))

    def encode_minilm(batch: list[str], context: bool) -> torch.Tensor:
        return pooled(teacher, (minilm_tok.contexts if context else minilm_tok.replies)(batch))

    at_start = None if (work / "checkpoint.pt").is_file() else judge(encode_student, pack.texts.separator)

    def batch_loss(step: int) -> torch.Tensor:
        start = (step * cfg.batch_size) % (len(texts) - cfg.batch_size)
        batch = texts[start : start + cfg.batch_size]
        with torch.no_grad():
            targets = pooled(teacher, minilm_tok.replies(batch))  # [B, D]
        return (1 - (student(*student_tok.replies(batch)) * targets).sum(-1)).mean()

    checkpoint = work / "checkpoint.pt"
    modules: dict[str, nn.Module] = {"student": student}
    stage = run_steps("mapped", modules, optimizer, cfg.steps, cfg.warmup_fraction, batch_loss, checkpoint, every=50)
    student.eval()
    return {
        "config": asdict(cfg),
        "shared_words": len(pairs),
        "training": stage,
        "student_at_start": at_start,  # the least-squares map before any step (None on a resumed run)
        "student": judge(encode_student, pack.texts.separator),
        "all-MiniLM-L6-v2": judge(encode_minilm, pack.texts.minilm_separator),
    }


def judge_e5(pack: Pack, cfg: MapConfig) -> dict[str, Any]:
    """The pack's multilingual-e5-small, zero-shot, on the same protocol: Korean's reference."""
    body = pack.e5_body(tuple(range(pack.meta["e5_shape"]["layers"]))).eval()
    tokens = Tokenise(pack.folder / STUDENT_TOKENIZER, cfg.max_tokens, cfg.max_tokens, context_prefix="query: ")

    def encode_e5(batch: list[str], context: bool) -> torch.Tensor:
        if context:
            return pooled(body, tokens.contexts(["query: " + t for t in batch]))
        return pooled(body, tokens.replies(["passage: " + t for t in batch]))

    return judge(encode_e5, pack.texts.separator)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pack", type=Path, default=Path("artifacts/pack"))
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=MapConfig.steps)
    parser.add_argument("--train-layers", action="store_true")
    parser.add_argument("--e5-only", action="store_true", help="judge the pack's zero-shot e5 alone -> e5.json")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    if args.e5_only:
        figures = judge_e5(Pack(args.pack), MapConfig())
        (args.work / "e5.json").write_text(json.dumps(figures, indent=1))
        print(json.dumps(figures, indent=1))
        return
    figures = train(Pack(args.pack), MapConfig(steps=args.steps, train_layers=args.train_layers), args.work)
    (args.work / "run.json").write_text(json.dumps(figures, indent=1))
    print(json.dumps({k: v for k, v in figures.items() if k != "config"}, indent=1))


if __name__ == "__main__":
    main()
