"""A SentencePiece (Unigram) tokenizer.json cut down to the pieces a student keeps.

multilingual-e5-small's embedding table is 250k rows of 384: 96M of its
118M parameters, for ~100 languages. A student that serves English and
Korean needs a small part of it. The pieces kept are:

- the four specials, in their ids (0 <s>, 1 <pad>, 2 </s>, 3 <unk>);
- every piece that the texts given to `kept_pieces` tokenise to (training
  text and our own evaluation text, never the out-of-domain sets);
- every piece made only of Hangul, so any Korean word still segments into
  pieces the model has seen as Korean;
- every single character of the scripts served (Latin, Hangul, digits,
  punctuation, symbols, emoji), so text of those scripts never becomes <unk>:
  a word whose piece was dropped splits into smaller kept pieces instead.

The trimmed tokenizer keeps the full one's normaliser, pre-tokeniser and
piece scores, so Viterbi picks among the kept pieces by the same unigram
probabilities. Piece i of the trimmed vocabulary is row `rows[i]` of the full
embedding table. No torch here: the index build and tests read it too.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

SPECIALS = 4  # <s>, <pad>, </s>, <unk>: ids 0..3 in XLM-R's vocabulary, kept where they are
_META = "\u2581"  # SentencePiece's word-start mark
_HANGUL = re.compile(r"^[\uac00-\ud7a3\u1100-\u11ff\u3131-\u318e]+$")


def served_character(char: str) -> bool:
    """Whether a single character belongs to a script the student serves (English, Korean) or to none."""
    code = ord(char)
    return (
        code < 0x250  # ASCII, Latin-1, Latin Extended-A/B
        or 0x1E00 <= code <= 0x1EFF  # Latin Extended Additional
        or 0x2000 <= code <= 0x2BFF  # punctuation, currency, letterlike, arrows, maths, symbols
        or 0x3000 <= code <= 0x303F  # CJK symbols and punctuation (「」, 〜)
        or 0xAC00 <= code <= 0xD7A3  # Hangul syllables
        or 0x1100 <= code <= 0x11FF  # Hangul jamo
        or 0x3130 <= code <= 0x318F  # Hangul compatibility jamo (ㅋ, ㅠ)
        or 0xFE00 <= code <= 0xFE0F  # variation selectors (emoji presentation)
        or 0xFF00 <= code <= 0xFFEF  # full-width forms
        or code >= 0x1F000  # emoji and pictographs
    )


def kept_pieces(pieces: list[str], used: Iterable[int]) -> list[int]:
    """Sorted ids of the full vocabulary to keep: specials, `used`, Hangul pieces, served single characters."""
    keep = set(range(SPECIALS)) | set(used)
    for i, piece in enumerate(pieces):
        core = piece.removeprefix(_META)
        if _HANGUL.match(core) or (len(core) == 1 and served_character(core)):
            keep.add(i)
    return sorted(keep)


def used_ids(tokenizer_path: Path, texts: Iterable[str], prefixes: tuple[str, ...]) -> set[int]:
    """Every id that the texts tokenise to, with each prefix (E5's "query: " and "passage: ")."""
    tokenizer = Tokenizer.from_file(str(tokenizer_path))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    texts = list(texts)
    used: set[int] = set()
    for prefix in prefixes:
        for encoding in tokenizer.encode_batch([prefix + t for t in texts]):
            used.update(encoding.ids)
    return used


@dataclass(frozen=True)
class TrimmedVocabulary:
    rows: np.ndarray  # [V'] int64: full-vocabulary id of each kept piece, ascending
    tokenizer: dict[str, Any]  # the trimmed tokenizer.json

    @property
    def size(self) -> int:
        return len(self.rows)

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.tokenizer, ensure_ascii=False))


def trim(tokenizer_path: Path, rows: list[int]) -> TrimmedVocabulary:
    """The tokenizer.json with only `rows` of its Unigram vocabulary, ids renumbered in order."""
    full = json.loads(tokenizer_path.read_text(encoding="utf-8"))
    model = full["model"]
    if model.get("type") != "Unigram":
        raise ValueError(f"{tokenizer_path}: a {model.get('type')} model; trimming knows Unigram")
    if rows[:SPECIALS] != list(range(SPECIALS)):
        raise ValueError("the specials must be kept at ids 0..3")
    vocab = model["vocab"]  # [[piece, score], ...]
    new_id = {old: new for new, old in enumerate(rows)}
    trimmed = dict(full)
    trimmed["model"] = {**model, "vocab": [vocab[i] for i in rows]}
    # Added tokens (<mask> at the end of XLM-R's list) keep a place only if their piece was kept.
    trimmed["added_tokens"] = [
        {**token, "id": new_id[token["id"]]} for token in full.get("added_tokens", []) if token["id"] in new_id
    ]
    processor = trimmed.get("post_processor") or {}
    for special in processor.get("special_tokens", {}).values():
        special["ids"] = [new_id[i] for i in special["ids"]]
    trimmed["truncation"], trimmed["padding"] = None, None
    return TrimmedVocabulary(np.asarray(rows, dtype=np.int64), trimmed)
