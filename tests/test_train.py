"""The training pipeline end to end on a tiny model and a tiny corpus, then served."""

from __future__ import annotations

import json
import random
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from app.config import Settings
from app.engine.bundle import TOKENIZER_FILE, ranked_bundles, read_manifest
from app.engine.encoder import Encoder
from app.engine.runtime import build_runtime
from index.build import build_version, corpus_candidates
from index.store import IndexStore
from models.calibrate import calibrate
from models.encoder import DualEncoder, minilm_path, tiny_body
from models.evaluate import evaluate_all, metrics, ranks
from models.reactions import ReactionSet
from models.train import TrainConfig, run

REACTIONS = ["haha", "Hahahaha!", "yeah", "nice", "oh no", "cool!"]
TOPICS = ["dogs", "pizza", "hiking", "movies", "school", "music", "weather", "games", "travel", "work"]


def tiny_corpus(path: Path, conversations: int = 600, seed: int = 0) -> Path:
    """Conversations whose replies echo the topic of the turn before, so there is something to learn."""
    rng = random.Random(seed)
    corpus = {}
    for i in range(conversations):
        messages = []
        for turn in range(5):
            topic = rng.choice(TOPICS)
            text = f"{rng.choice(['i like', 'what about', 'tell me about', 'so'])} {topic} {rng.randint(0, 999)}"
            if rng.random() < 0.15:  # short reactions, for the reaction classifier to mine
                text = rng.choice(REACTIONS)
            messages.append([{"text": text, "sender": f"u{turn % 2}"}])
        corpus[f"conv-{i}"] = {"messages": messages}
    path.write_text(json.dumps(corpus))
    return path


def test_ranks_and_metrics() -> None:
    import numpy as np

    context = np.eye(3, dtype=np.float32)  # [3, 3]
    reply = np.array([[1, 0, 0], [1, 0, 0], [0, 0.6, 0.8]], dtype=np.float32)  # row 1 loses to row 0
    negatives = np.array([[1, 2], [0, 2], [0, 1]])
    rank = ranks(context, reply, negatives)
    assert rank.tolist() == [1, 2, 1]
    assert metrics(rank) == {"r_at_1": round(2 / 3, 4), "r_at_10": 1.0, "mrr": round((1 + 0.5 + 1) / 3, 4)}


@pytest.mark.anyio
async def test_pipeline_trains_exports_evaluates_and_the_service_serves_the_student(tmp_path: Path) -> None:
    corpus = tiny_corpus(tmp_path / "corpus.json")
    artifacts = tmp_path / "artifacts"
    cfg = TrainConfig("tiny", teacher_budget_s=30, distill_budget_s=30, student_budget_s=30, max_steps=3, batch_size=8)
    # A 2-layer student of a 4-layer teacher; poly heads with m = 2 or 4 codes.
    cfg = replace(cfg, student_layers=(1, 3), poly_codes=(2, 4), poly_pairs=500, validation_examples=150)
    teacher = DualEncoder(tiny_body(vocab_size=30522, hidden=32, layers=4))
    outputs = run(
        cfg,
        artifacts / "bundles",
        teacher,
        minilm_path() / TOKENIZER_FILE,
        "tiny",
        data_path=corpus,
        parity_texts=["i like dogs 1", "what about pizza 7", "so hiking"],
        min_parity_cosine=0.9,  # a random 32-wide model quantises worse than a trained one
    )
    names = sorted(p.name for p in outputs.bundles)
    assert names == [
        "chitchat-student-l2-fp32",
        "chitchat-student-l2-int8",
        "chitchat-teacher-l4-fp32",
        "chitchat-teacher-l4-int8",
    ]
    assert all(outputs.stats[stage]["steps"] == 3 for stage in ("teacher", "distill", "student"))
    assert sorted(p.name for p in (artifacts / "checkpoints").iterdir()) == [
        "chitchat-student.pt",
        "chitchat-teacher.pt",
    ]

    # The student carries the poly head (m chosen among the candidates) and the reaction classifier.
    student_dir = artifacts / "bundles" / "chitchat-student-l2-int8"
    student = read_manifest(student_dir)
    assert student.poly is not None and student.poly.codes in cfg.poly_codes and 0 < student.poly.weight < 1
    assert Encoder(student_dir, student).has_poly
    assert student.reactions is not None
    laughs = ReactionSet.from_labels(student.reactions.labels).classify(["haha", "HAHAHA!!", "Hahahaha!"])
    assert laughs[0] >= 0 and len(set(laughs.tolist())) == 1  # one class for every spelling of laughter
    assert read_manifest(artifacts / "bundles" / "chitchat-teacher-l4-int8").poly is None

    store = IndexStore(artifacts / "indexes")
    manifest = build_version(
        corpus_candidates(3, path=corpus), Encoder(student_dir, student), student.checksum, store, "t", progress=False
    )
    store.set_current(manifest.version)

    judge = artifacts / "bundles" / "chitchat-teacher-l4-int8"
    fitted = calibrate(artifacts, judge, examples=150, seed=1, data_path=corpus)
    calibrated = read_manifest(student_dir)
    assert calibrated.checksum == student.checksum  # thresholds live beside the files, not in them
    assert fitted["thresholds"] == asdict(calibrated.thresholds)
    assert calibrated.calibration["value"] >= max(calibrated.calibration["baselines"].values())
    assert sum(calibrated.calibration["shares"].values()) == pytest.approx(1.0, abs=1e-3)
    assert calibrated.calibration["off_topic_cost"] >= 0 and len(calibrated.calibration["reaction_share_by_cost"]) == 5

    rows = evaluate_all(artifacts / "bundles", tmp_path / "reports", n=200, seed=0, path=corpus, judge=judge)
    assert rows[0]["model"] == "TF-IDF, last turn"
    assert all(0 <= r["r_at_1"] <= r["r_at_10"] <= 1 for r in rows)
    student_row = next(r for r in rows if r["model"] == student.name)
    assert 0 <= student_row["rerank_r_at_1"] <= 1
    assert 0 <= student_row["reaction_acc_at_1"] <= student_row["reaction_acc_at_5"] <= 1
    report = json.loads((tmp_path / "reports" / "eval.json").read_text())
    assert sum(p["share"] for p in report["sources"]["per_source"]) == pytest.approx(1.0, abs=1e-3)
    assert [c["share"] for c in report["sources"]["fallback_curve"]] == [0.05, 0.1, 0.2, 0.3]
    assert "| reaction |" in (tmp_path / "reports" / "eval.md").read_text()

    # Only the int8 student is servable, and its manifest now carries its figures.
    assert [p.name for p in ranked_bundles(artifacts / "bundles")] == ["chitchat-student-l2-int8"]
    assert read_manifest(student_dir).eval["r_at_1"] == student_row["r_at_1"]
    runtime = build_runtime(Settings(artifacts_dir=artifacts))
    assert runtime.current().bundle.name == "chitchat-student-l2-int8"
