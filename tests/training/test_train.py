"""The training pipeline on a tiny model and a tiny corpus: losses fall, a
resumed run is the same run, and train -> index -> calibrate -> eval ->
release -> serve works end to end."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from app.engine.runtime import build_runtime
from app.engine.sets import NotReady
from core.bundle import TOKENIZER_FILE, BundleError, open_bundle, read_manifest
from core.encoder import Encoder
from core.store import IndexStore
from index.build import build_version, corpus_candidates
from models import teacher as teacher_stage
from models.batches import BatchPlan, Tokenise
from models.calibrate import calibrate
from models.config import TrainConfig
from models.dataset import train_pairs
from models.encoder import DualEncoder, minilm_path, tiny_body
from models.evalset import metrics, ranks
from models.evaluate import evaluate_all
from models.losses import both_ways_in_batch_negatives, in_batch_negatives
from models.reactions import ReactionSet
from models.release import GATES, Evidence, ReleaseRefused, promote
from models.teacher import train_teacher
from models.train import run
from tests.helpers import settings_for

pytestmark = [pytest.mark.training, pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")]

REACTIONS = ["haha", "Hahahaha!", "yeah", "nice", "oh no", "cool!"]
TOPICS = ["dogs", "pizza", "hiking", "movies", "school", "music", "weather", "games", "travel", "work"]
PARITY = ["i like dogs 1", "what about pizza 7", "so hiking"]


def tiny_corpus(path: Path, conversations: int = 600, seed: int = 0) -> Path:
    """Conversations whose turns mostly stay on the topic of the turn before, so there is something to learn."""
    rng = random.Random(seed)
    corpus = {}
    for i in range(conversations):
        messages = []
        topic = rng.choice(TOPICS)
        for turn in range(5):
            if rng.random() < 0.2:
                topic = rng.choice(TOPICS)
            text = f"{rng.choice(['i like', 'what about', 'tell me about', 'so'])} {topic} {rng.randint(0, 999)}"
            if rng.random() < 0.15:  # short reactions, for the reaction classifier to mine
                text = rng.choice(REACTIONS)
            messages.append([{"text": text, "sender": f"u{turn % 2}"}])
        corpus[f"conv-{i}"] = {"messages": messages}
    path.write_text(json.dumps(corpus))
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_corpus(tmp_path_factory.mktemp("corpus") / "corpus.json")


def tiny_config(**changes: object) -> TrainConfig:
    cfg = TrainConfig("tiny", batch_size=8, student_layers=(1, 3), poly_codes=2, validation_examples=150)
    return replace(cfg, **changes)  # type: ignore[arg-type]


def test_ranks_and_metrics() -> None:
    context = np.eye(3, dtype=np.float32)  # [3, 3]
    reply = np.array([[1, 0, 0], [1, 0, 0], [0, 0.6, 0.8]], dtype=np.float32)  # row 1 loses to row 0
    negatives = np.array([[1, 2], [0, 2], [0, 1]])
    rank = ranks(context, reply, negatives)
    assert rank.tolist() == [1, 2, 1]
    assert metrics(rank) == {"r_at_1": round(2 / 3, 4), "r_at_10": 1.0, "mrr": round((1 + 0.5 + 1) / 3, 4)}


def test_the_both_ways_loss_also_charges_a_reply_that_is_close_to_every_context() -> None:
    contexts = torch.eye(8)  # [B, D]: 8 orthogonal contexts
    replies = torch.eye(8)  # [B, D]: each reply on its own context
    # Pairs that are perfect and symmetric cost the same either way.
    assert torch.isclose(
        both_ways_in_batch_negatives(contexts, replies, 20.0), in_batch_negatives(contexts, replies, 20.0)
    )
    replies[0] = torch.full((8,), 8**-0.5)  # a hub: equally close to every context
    one_way = in_batch_negatives(contexts, replies, 20.0)
    both_ways = both_ways_in_batch_negatives(contexts, replies, 20.0)
    # One way, the hub costs only a little on the other rows. Transposed, its own
    # row is a uniform pick among 8 contexts: a loss of ln 8 on that row.
    assert both_ways > one_way
    assert torch.isclose(both_ways, both_ways_in_batch_negatives(replies, contexts, 20.0))


def test_batch_plan_never_repeats_a_reply_in_a_batch_and_is_a_function_of_the_step() -> None:
    keys = [f"r{i % 50}" for i in range(1000)]  # every reply 20 times
    lengths = [i % 37 for i in range(1000)]
    plan = BatchPlan(keys, lengths, batch_size=16, length_group=4, seed=3)
    again = BatchPlan(keys, lengths, batch_size=16, length_group=4, seed=3)
    for step in range(0, 3 * plan.per_epoch, 7):
        batch = plan.batch(step)
        assert len(batch) == 16 and len({keys[r] for r in batch}) == 16
        assert batch == again.batch(step)
    first_epoch = [row for step in range(plan.per_epoch) for row in plan.batch(step)]
    assert len(set(first_epoch)) >= 0.9 * len(keys)  # one pass sees nearly every row


def test_the_teacher_loss_falls_on_a_tiny_set(corpus: Path, tmp_path: Path) -> None:
    pairs = train_pairs(3, corpus)
    tok = Tokenise(minilm_path() / TOKENIZER_FILE, 32, 16)
    model = DualEncoder(tiny_body(vocab_size=30522, hidden=32, layers=2))
    cfg = tiny_config(batch_size=32, max_steps=60, teacher_lr=1e-3, warmup_fraction=0.1)
    stats = train_teacher(model, pairs, tok, cfg, tmp_path / "teacher.pt", "cpu")
    assert stats["steps"] == 60
    # Means of the first and last 20 steps; the in-batch loss starts near log(32) = 3.47.
    assert stats["final_loss"] < 0.95 * stats["first_loss"]


def test_a_resumed_run_continues_the_same_run(corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pairs = train_pairs(3, corpus)
    tok = Tokenise(minilm_path() / TOKENIZER_FILE, 32, 16)
    cfg = tiny_config(max_steps=6, checkpoint_every=2)

    def train(checkpoint: Path) -> DualEncoder:
        model = DualEncoder(tiny_body(vocab_size=30522, hidden=32, layers=2, seed=5))
        train_teacher(model, pairs, tok, cfg, checkpoint, "cpu")
        return model

    straight = train(tmp_path / "straight.pt")

    real_loss, calls = teacher_stage.in_batch_negatives, {"n": 0}

    def crash_at_step_five(*args: object) -> torch.Tensor:
        calls["n"] += 1
        if calls["n"] == 5:
            raise KeyboardInterrupt("the machine went away")
        return real_loss(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(teacher_stage, "in_batch_negatives", crash_at_step_five)
    with pytest.raises(KeyboardInterrupt):
        train(tmp_path / "resumed.pt")
    assert torch.load(tmp_path / "resumed.pt", weights_only=False)["step"] == 4  # the last checkpoint
    monkeypatch.setattr(teacher_stage, "in_batch_negatives", real_loss)
    resumed = train(tmp_path / "resumed.pt")
    for (name, a), (_, b) in zip(straight.state_dict().items(), resumed.state_dict().items(), strict=True):
        assert torch.equal(a, b), name


def test_a_bundle_whose_files_do_not_match_its_manifest_is_refused(artifacts: Path, tmp_path: Path) -> None:
    import shutil

    bundle = tmp_path / "tampered"
    shutil.copytree(artifacts / "bundles" / "tiny-int8", bundle)
    with (bundle / TOKENIZER_FILE).open("a") as f:
        f.write(" ")
    with pytest.raises(BundleError, match="sha256"):
        open_bundle(bundle)
    with pytest.raises(BundleError):
        promote(bundle, Evidence(), {}, target=tmp_path / "release")
    assert not (tmp_path / "release").exists()
    with pytest.raises(NotReady, match="sha256"):  # nor does the service serve it: it stays not ready, and says why
        build_runtime(settings_for(artifacts, bundle_dir=bundle)).current()


@pytest.mark.anyio
async def test_train_index_calibrate_evaluate_release_and_serve(corpus: Path, tmp_path: Path) -> None:
    artifacts = tmp_path / "artifacts"
    cfg = tiny_config(max_steps=3)
    teacher = DualEncoder(tiny_body(vocab_size=30522, hidden=32, layers=4))
    outputs = run(cfg, artifacts, teacher, minilm_path() / TOKENIZER_FILE, "tiny", corpus, PARITY, 0.9)
    assert sorted(p.name for p in outputs.bundles) == [
        "chitchat-student-l2-fp32",
        "chitchat-student-l2-int8",
        "chitchat-teacher-l4-fp32",
        "chitchat-teacher-l4-int8",
    ]
    assert outputs.stats["teacher"]["steps"] == outputs.stats["student"]["steps"] == 3
    # A second run finds every training stage done and trains nothing.
    again = run(
        cfg,
        artifacts,
        DualEncoder(tiny_body(30522, 32, 4)),
        minilm_path() / TOKENIZER_FILE,
        "tiny",
        corpus,
        PARITY,
        0.9,
    )
    assert again.stats["teacher"] == outputs.stats["teacher"]

    student_dir = artifacts / "bundles" / "chitchat-student-l2-int8"
    student = open_bundle(student_dir)
    assert student.poly is not None and student.poly.codes == 2 and 0 < student.poly.weight < 1
    assert Encoder(student_dir, student).has_poly
    assert student.reactions is not None
    laughs = ReactionSet.from_labels(student.reactions.labels).classify(["haha", "HAHAHA!!", "Hahahaha!"])
    assert laughs[0] >= 0 and len(set(laughs.tolist())) == 1  # one class for every spelling of laughter
    assert student.training["config"]["seed"] == 0 and "hardware" in student.training
    assert set(student.training["stages"]) >= {"teacher", "teacher_vectors", "student"}
    assert len(student.data["split_sha256"]) == 64

    store = IndexStore(artifacts / "indexes")
    manifest = build_version(
        corpus_candidates(3, path=corpus), Encoder(student_dir, student), student.checksum, store, "t", progress=False
    )
    store.set_current(manifest.version)
    judge = artifacts / "bundles" / "chitchat-teacher-l4-int8"
    fitted = calibrate(artifacts, student_dir, judge, examples=150, seed=1, data_path=corpus)
    calibrated = read_manifest(student_dir)
    assert calibrated.checksum == student.checksum  # thresholds live beside the files, not in them
    assert calibrated.confidence is not None and len(calibrated.confidence.quantiles) == 101
    assert fitted["shares"]["reaction"] == pytest.approx(0.1, abs=0.03)

    report = evaluate_all(artifacts, tmp_path / "reports", 200, 0, student_dir, judge, path=corpus)
    assert report["rows"][0]["model"] == "TF-IDF, last turn"
    assert all(0 <= r["r_at_1"] <= r["r_at_10"] <= 1 for r in report["rows"])
    served = report["served"]
    assert sum(p["share"] for p in served["per_source"]) == pytest.approx(1.0, abs=1e-3)
    assert served["served_echo_share"] == 0.0
    assert 0 <= served["confidence"]["auroc"] <= 1
    assert (tmp_path / "reports" / "reliability.png").stat().st_size > 1000
    assert "| reaction |" in (tmp_path / "reports" / "eval.md").read_text()
    evaluated = read_manifest(student_dir)
    assert {"r_at_1", "rerank_gain", "confidence_auroc", "served_echo_share"} <= set(evaluated.eval)

    # A tiny model passes few gates, and with no out-of-domain evidence none of those: the release
    # is refused unless each failure is waived by name.
    target = tmp_path / "release" / "chitchat"
    with pytest.raises(ReleaseRefused, match="gates failed"):
        promote(student_dir, Evidence(), {}, target)
    assert not target.exists()
    released = promote(student_dir, Evidence(), {g.name: "a tiny test model" for g in GATES}, target)
    assert open_bundle(target).checksum == student.checksum
    assert {r["gate"] for r in released.release["gates"]} == {g.name for g in GATES}

    # The service serves the released copy, with the index built for the student.
    runtime = build_runtime(settings_for(artifacts, bundle_dir=target))
    serving = runtime.current()
    assert serving.bundle.name == "chitchat-student-l2-int8" and serving.confidence is not None
    assert serving.thresholds.reply_matching == pytest.approx(serving.confidence.threshold_for_share(0.1))
