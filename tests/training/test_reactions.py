"""The reaction recipe (models/reactions/head.py) on a tiny bundle and a tiny emotion set: it learns the
table's classes, chooses gates by its rule, and writes a head the service loads, into a bundle
whose manifest still checks out."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from core.bundle import REACTIONS_FILE, open_bundle
from core.encoder import Encoder
from core.reactions import ReactionClassifier
from models.reactions import emotions
from models.reactions.classes import CLASS_NAMES, FALLBACK, MIRRORS, REACTION_CLASSES
from models.reactions.head import install, train_reactions
from models.reactions.model import ReactionConfig

pytestmark = pytest.mark.training

# (source, labels, a few texts): enough of each kind and side for every split the recipe reads.
ROWS = {
    "goemotions": [
        (["sadness"], ["my dog died", "I lost my job", "I failed the test"]),
        (["joy"], ["I got the job", "we won the game", "best day ever"]),
        (["gratitude"], ["thanks a lot", "thank you so much"]),
        (["amusement"], ["lol that is hilarious", "haha so funny"]),
        (["neutral"], ["the bus comes at six", "I live in Ohio"]),
        (["anger"], ["this is so annoying"]),
    ],
    "kote": [
        (["슬픔"], ["너무 슬퍼", "강아지가 죽었어"]),
        (["기쁨"], ["너무 기뻐", "합격했어"]),
        (["놀람"], ["헐 진짜?"]),
    ],
    "nsmc": [(["positive"], ["최고의 영화", "정말 재밌다"]), (["negative"], ["최악의 영화", "지루하다"])],
    "goemotions_ko_mt": [(["sadness"], ["나는 슬프다"]), (["joy"], ["나는 행복하다"]), (["gratitude"], ["감사합니다"])],
}
SPLITS = {"goemotions": ("train", "dev", "test"), "goemotions_ko_mt": ("train", "dev", "test")}


def tiny_emotions(folder: Path) -> Path:
    """The four files in the staged format, each text in each of the source's splits."""
    folder.mkdir()
    for source, rows in ROWS.items():
        splits = SPLITS.get(source, ("val", "test") if source == "kote" else ("train", "test"))
        lines = []
        for labels, texts in rows:
            for text in texts:
                for split in splits:
                    # KOTE's val and NSMC's train split are cut into train and dev by the id's hash:
                    # ten copies under ten ids put some in each.
                    for copy in range(10 if split in ("val",) or (source == "nsmc" and split == "train") else 1):
                        row_id = f"{source}-{split}-{text}-{copy}"
                        lines.append({"id": row_id, "text": text, "labels": labels, "source": source, "split": split})
        name, _ = emotions.FILES[source]
        with gzip.open(folder / name, "wt", encoding="utf-8") as f:
            f.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in lines))
    return folder


SMALL = ReactionConfig(
    per_class=20,
    valence_per_side=20,
    steps=60,
    valence_grid=(0.6, 0.9),
    guard_grid=(0.8, 1.0),
    sided_grid=(0.5, 1.01),
    floor_grid=(0.5, 1.01),
    mirror_grid=(0.9, 1.01),
    phase_grid=(0.0,),
)


def test_the_recipe_writes_a_head_with_the_tables_classes_and_gates(torch_artifacts: Path, tmp_path: Path) -> None:
    bundle = torch_artifacts / "bundles" / "tiny-int8"
    encoder = Encoder(bundle, open_bundle(bundle))
    model, stats = train_reactions(encoder, SMALL, tiny_emotions(tmp_path / "emotions"), tmp_path / "cache")

    spec = model.spec
    assert spec.labels == [c.surface["en"] for c in REACTION_CLASSES]
    assert spec.stances == [c.stance for c in REACTION_CLASSES]
    assert spec.fallback == CLASS_NAMES.index(FALLBACK) and spec.floors[spec.fallback] == 0.0
    assert all(spec.floors[CLASS_NAMES.index(m)] >= 0.9 for m in MIRRORS)
    assert set(spec.margins) == {"valence", "phase"} and set(spec.guards) <= {"valence-"}
    # The rule: no wrong reaction on half A (the grid can always answer with the fallback alone).
    assert stats["gates"]["half_a_wrong"] == 0
    assert stats["data"]["by_source"]["written"] > 0 and stats["data"]["by_source"]["goemotions"] > 0

    copy = tmp_path / "bundle"
    shutil.copytree(bundle, copy)
    install(copy, model, stats)
    manifest = open_bundle(copy)  # resealed: the new head's checksum is the one recorded
    assert manifest.files[REACTIONS_FILE] != open_bundle(bundle).files.get(REACTIONS_FILE)
    assert manifest.files["encoder.onnx"] == open_bundle(bundle).files["encoder.onnx"]  # retrieval untouched
    assert manifest.training["reactions"]["gates"] == stats["gates"] and manifest.reactions is not None
    served = ReactionClassifier.load(copy, manifest.reactions)  # learned axes: no encoder needed
    contexts = encoder.encode(["my dog died", "I won the lottery", "good night"], side="context")  # [3, D]
    for context in contexts:
        top = served.top(context, len(CLASS_NAMES))
        assert top[-1][0] == served.fallback  # the fallback stands behind every answer
    assert np.array_equal(served.answers(contexts), [served.top(c, 1)[0][0] for c in contexts])


def test_the_recipe_says_where_the_emotion_sets_are_when_they_are_missing(
    torch_artifacts: Path, tmp_path: Path
) -> None:
    bundle = torch_artifacts / "bundles" / "tiny-int8"
    with pytest.raises(FileNotFoundError, match="no emotion sets"):
        train_reactions(Encoder(bundle, open_bundle(bundle)), SMALL, tmp_path / "nowhere", tmp_path / "cache")
