"""Our written and translated Korean conversations: cut into pairs and kept apart
from our evaluation sets; the e5 pack's Korean pairs (models/e5/pack.py)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from core.text import Signature, near_copy
from index.corpus import load_conversations, split_of
from models.e5.multilingual import BundleSpec
from models.written_korean import (
    TRANSLATED,
    WRITTEN,
    eval_signatures,
    nearest_written,
    written_conversations,
    written_korean_pairs,
)

pytestmark = pytest.mark.training


def test_a_conversation_with_a_near_copy_of_an_eval_line_is_dropped_whole(tmp_path: Path) -> None:
    path = tmp_path / "written.jsonl"
    rows = [
        ["점심 뭐 먹을래?", "마라탕 어때", "좋아 12시에 보자"],
        ["주말에 뭐 해?", "집에서 드라마 정주행할 거야!!", "뭐 보는데"],  # the held-out line, up to punctuation
    ]
    path.write_text("\n".join(json.dumps({"turns": t}, ensure_ascii=False) for t in rows) + "\n", encoding="utf-8")
    held_out = [Signature.of("집에서 드라마 정주행할 거야")]
    assert written_conversations(path, held_out) == [rows[0]]
    pairs = written_korean_pairs(3, " | ", path)  # the real eval sets hold none of these lines: both kept
    assert pairs.contexts == [
        "점심 뭐 먹을래?",
        "점심 뭐 먹을래? | 마라탕 어때",
        "주말에 뭐 해?",
        "주말에 뭐 해? | " + rows[1][1],
    ]
    assert pairs.replies == [*rows[0][1:], *rows[1][1:]]


@pytest.mark.parametrize("path", [WRITTEN, TRANSLATED], ids=["written", "translated"])
def test_the_tracked_file_is_korean_and_shares_no_line_with_our_eval_sets(path: Path) -> None:
    rows = [json.loads(line)["turns"] for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    kept = written_conversations(path)
    assert len(kept) > 0.9 * len(rows) > 400  # checked before commit: the load-time filter finds little
    held_out = eval_signatures()
    lines = {line for turns in kept for line in turns}
    signatures = [Signature.of(line) for line in lines]
    assert not any(near_copy(s, h) for s in signatures for h in held_out)
    hangul = sum(any("\uac00" <= c <= "\ud7a3" for c in line) for line in lines)
    assert hangul > 0.95 * len(lines)


def test_the_translations_come_from_chitchats_train_split_turn_for_turn() -> None:
    sources = {c.id: c.turns for c in load_conversations()}
    rows = [json.loads(line) for line in TRANSLATED.read_text(encoding="utf-8").splitlines() if line.strip()]
    assert len({(r["source"], r["start"]) for r in rows}) == len(rows)
    for row in rows:  # a validation or test conversation here would leak the English eval into training
        assert split_of(row["source"]) == "train"
        assert len(sources[row["source"]][row["start"] : row["start"] + len(row["turns"])]) == len(row["turns"])


def test_each_file_brings_the_pack_over_a_thousand_korean_pairs() -> None:
    spec = BundleSpec()  # as models/e5/pack.py cuts them: the bundle's turns and separator
    pairs = [written_korean_pairs(spec.max_context_turns, spec.turn_separator, path) for path in (WRITTEN, TRANSLATED)]
    assert min(len(p) for p in pairs) > 1000


def test_nearest_written_finds_the_eval_conversation_the_file_holds(tmp_path: Path) -> None:
    path = tmp_path / "written.jsonl"
    turns = ["비 온대", "우산 챙겨", "고마워"]
    path.write_text(json.dumps({"turns": turns}, ensure_ascii=False) + "\n", encoding="utf-8")
    rng, seen = np.random.default_rng(0), {}

    def encode(texts: list[str], side: str) -> np.ndarray:  # one random unit vector per distinct text
        vectors = np.stack([seen.setdefault(t, rng.standard_normal(64)) for t in texts])
        return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)  # [N, 64]

    # The file's pairs, as texts: "비 온대 우산 챙겨" and "비 온대 우산 챙겨 고마워".
    rows = [{"context": ["비 온대", "우산 챙겨"], "reply": "고마워"}, {"context": ["우산 챙겨"], "reply": "고마워"}]
    near = nearest_written(SimpleNamespace(encode=encode), rows, path=path)  # [2]
    assert near[0] == pytest.approx(1.0) and near[1] < 0.9  # a part of a pair is not the pair
