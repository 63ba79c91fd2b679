"""The recipe that ships, on a tiny model: e5's top layers tuned (`models.e5.teacher`, on a tiny pack
whose random BERT stands in for the package's weights: tests/training/tiny_pack.py), the bundle
built from them with its reaction classifier (`models.e5.multilingual`), then index -> calibrate ->
eval -> release -> serve. A tune killed mid-run and resumed ends where an unbroken one does. And
the pieces every recipe shares: ranks and metrics, the losses, the batch plan, a bundle's checksums."""

from __future__ import annotations

import json
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
from models.batches import BatchPlan
from models.calibrate import calibrate
from models.e5 import multilingual, teacher
from models.e5.multilingual_release import tune_source
from models.e5.pack import E5Pack
from models.e5.teacher import TeacherConfig
from models.evalset import metrics, ranks
from models.evaluate import evaluate_all
from models.losses import both_ways_in_batch_negatives, in_batch_negatives
from models.release import GATES, Evidence, ReleaseRefused, promote
from models.trained_layers import LAYERS_FILE, overlay, read_layers, read_release, write_release
from tests.helpers import settings_for
from tests.training.tiny_bert import TEXTS
from tests.training.tiny_pack import topical_conversations

pytestmark = [pytest.mark.training, pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")]

# A run the size of a test: 1 of the tiny model's 2 layers, batches of 8, Korean every 2nd step,
# 3% of a pass over the tiny pack's English pairs: 4 steps, a checkpoint after the 2nd.
TINY_TEACHER = TeacherConfig(trained_layers=1, epochs=0.03, batch_size=8, korean_every=2, checkpoint_every=2)
STEPS = 4


def tiny_corpus(path: Path, conversations: int = 600, seed: int = 0) -> Path:
    """The tiny pack's kind of conversations (topical, with short reactions), as chitchat's file has them."""
    corpus = {
        f"conv-{i}": {"messages": [[{"text": text, "sender": f"u{turn % 2}"}] for turn, text in enumerate(turns)]}
        for i, turns in enumerate(topical_conversations(conversations, seed))
    }
    path.write_text(json.dumps(corpus))
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_corpus(tmp_path_factory.mktemp("corpus") / "corpus.json")


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


def test_a_tune_killed_mid_run_resumes_to_where_an_unbroken_one_ends(
    e5_pack: E5Pack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    straight = teacher.train(TINY_TEACHER, e5_pack, tmp_path / "straight", "cpu", None)
    real_loss, calls = teacher.in_batch_negatives, {"n": 0}

    def crash_at_step_four(*args: object) -> torch.Tensor:
        calls["n"] += 1
        if calls["n"] == 4:
            raise KeyboardInterrupt("the machine went away")
        return real_loss(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(teacher, "in_batch_negatives", crash_at_step_four)
    with pytest.raises(KeyboardInterrupt):
        teacher.train(TINY_TEACHER, e5_pack, tmp_path / "resumed", "cpu", None)
    assert torch.load(tmp_path / "resumed" / "checkpoint.pt", weights_only=False)["step"] == 2  # the last checkpoint
    monkeypatch.setattr(teacher, "in_batch_negatives", real_loss)
    resumed = teacher.train(TINY_TEACHER, e5_pack, tmp_path / "resumed", "cpu", None)
    assert resumed["train"]["steps"] == straight["train"]["steps"] == STEPS  # type: ignore[index]
    assert resumed["train"]["resumed_from_step"] == 2  # type: ignore[index]
    a, b = read_layers(tmp_path / "straight" / LAYERS_FILE), read_layers(tmp_path / "resumed" / LAYERS_FILE)
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


@pytest.mark.anyio
async def test_tune_build_index_calibrate_evaluate_release_and_serve(
    e5_pack: E5Pack, corpus: Path, tmp_path: Path
) -> None:
    run = tmp_path / "teacher"
    figures = teacher.train(TINY_TEACHER, e5_pack, run, "cpu", None)
    assert figures["steps_planned"] == figures["train"]["steps"] == STEPS  # type: ignore[index]
    # English and Korean batches both came, from the pack and nothing else.
    assert figures["english_passes"] > 0 and figures["korean_passes"] > 0  # type: ignore[operator]
    assert figures["data"] == {**e5_pack.meta["pairs"], "sources": e5_pack.meta["sources"]}
    assert set(figures["dev_half_a"]) == set(e5_pack.texts()["dev_half_a"])  # type: ignore[arg-type]
    layers = read_layers(run / LAYERS_FILE)
    assert {name.split(".")[2] for name in layers} == {"1"}  # only the top layer trained
    # As models/e5/multilingual_release.py records a teacher run it promotes.
    record = {"base": "the tiny pack", "trained_layers": 1, "alpha": 1.0, "source": tune_source(run)}
    write_release(tmp_path / "layers", layers, record)
    tracked, record = read_release(tmp_path / "layers")
    assert record["source"]["config"] == figures["config"]

    artifacts = tmp_path / "artifacts"
    spec = multilingual.tuned_spec(record, record["sha256"])
    out = artifacts / "bundles" / spec.name
    bundle = multilingual.build_bundle(overlay(e5_pack.weights(), tracked), spec, e5_pack.tokenizer, out, TEXTS)
    multilingual.add_class_reactions(bundle)
    student = open_bundle(bundle)
    assert student.training["layers"]["sha256"] == record["sha256"]
    assert student.reactions is not None and "valence-" in student.reactions.stances

    store = IndexStore(artifacts / "indexes")
    manifest = build_version(
        corpus_candidates(3, path=corpus), Encoder(bundle, student), student.checksum, store, "t", progress=False
    )
    store.set_current(manifest.version)
    fitted = calibrate(artifacts, bundle, bundle, examples=150, seed=1, data_path=corpus)
    calibrated = read_manifest(bundle)
    assert calibrated.checksum == student.checksum  # thresholds live beside the files, not in them
    assert calibrated.confidence is not None and len(calibrated.confidence.quantiles) == 101
    assert fitted["shares"]["reaction"] == pytest.approx(0.1, abs=0.03)

    report = evaluate_all(artifacts, tmp_path / "reports", 200, 0, bundle, bundle, path=corpus)
    assert report["rows"][0]["model"] == "TF-IDF, last turn"
    assert all(0 <= r["r_at_1"] <= r["r_at_10"] <= 1 for r in report["rows"])
    assert report["served"]["served_echo_share"] == 0.0
    # Its latency figures name the CPU they were read on.
    assert report["hardware"]["cpu"] and (tmp_path / "reports" / "eval.md").read_text().startswith("On ")
    assert {"r_at_1", "confidence_auroc", "served_echo_share"} <= set(read_manifest(bundle).eval)

    # A tiny model passes few gates, and with no out-of-domain evidence none of those: the release
    # is refused unless each failure is waived by name.
    target = tmp_path / "release" / "e5"
    with pytest.raises(ReleaseRefused, match="gates failed"):
        promote(bundle, Evidence(), {}, target)
    assert not target.exists()
    released = promote(bundle, Evidence(), {g.name: "a tiny test model" for g in GATES}, target)
    assert open_bundle(target).checksum == student.checksum
    assert {r["gate"] for r in released.release["gates"]} == {g.name for g in GATES}

    # The service serves the released copy, with the index built for it.
    serving = build_runtime(settings_for(artifacts, bundle_dir=target)).current()
    assert serving.bundle.name == spec.name and serving.confidence is not None and serving.reactions is not None
    assert serving.thresholds.reply_matching == pytest.approx(serving.confidence.threshold_for_share(0.1))
