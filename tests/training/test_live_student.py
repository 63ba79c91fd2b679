"""models/pack.py and models/live_student.py: what travels to a GPU machine, and a
whole run (teacher tune, rotation, student) on a tiny pack on the CPU."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import BertConfig

from models.encoder import minilm_path, tiny_body
from models.live_student import (
    LiveConfig,
    Pack,
    Teachers,
    TeacherTune,
    lay_teacher,
    load_student,
    procrustes,
    student_file,
    train,
    tune_teacher,
)
from models.loop import run_steps
from models.pack import E5_FILE, MINILM_DIR, MINILM_FILE, STUDENT_TOKENIZER, TEXTS_FILE, PackTexts, from_int8, to_int8

pytestmark = pytest.mark.training

HIDDEN = 32


def test_int8_transport_keeps_every_weight_within_half_a_step_of_its_rows_largest() -> None:
    rng = np.random.default_rng(0)
    tensors = {
        "w": rng.normal(size=(64, 128)).astype(np.float32),
        "bias": rng.normal(size=128).astype(np.float32),
        "zero_rows": np.zeros((64, 128), dtype=np.float32),
    }
    back = from_int8(to_int8(tensors))
    assert set(back) == set(tensors)
    step = np.abs(tensors["w"]).max(axis=1, keepdims=True) / 127  # [R, 1]
    assert np.all(np.abs(back["w"] - tensors["w"]) <= step / 2 + 1e-7)
    np.testing.assert_array_equal(back["bias"], tensors["bias"])  # small tensors travel as they are
    np.testing.assert_array_equal(back["zero_rows"], tensors["zero_rows"])


def test_pack_texts_store_each_turn_once_and_join_contexts_for_each_model(tmp_path: Path) -> None:
    texts = PackTexts(
        turns=["hi", "hey there", "how are you?", "good"],
        english_pairs=[[0, 1], [0, 1, 2], [1, 2, 3]],
        separator=" | ",
        minilm_separator=" [SEP] ",
        korean_contexts=["안녕"],
        korean_replies=["반가워"],
        broad={"en-chat": ["a"], "ko-chat": ["나"]},
        broad_shares={"en-chat": 0.5, "ko-chat": 0.5},
    )
    texts.save(tmp_path / TEXTS_FILE)
    back = PackTexts.load(tmp_path / TEXTS_FILE)
    assert back.english_contexts == ["hi", "hi | hey there", "hey there | how are you?"]
    assert back.english_minilm_contexts[1] == "hi [SEP] hey there"
    assert back.english_replies == ["hey there", "how are you?", "good"]
    assert back.korean_replies == ["반가워"]


def test_procrustes_finds_the_rotation_between_two_views_of_the_same_vectors() -> None:
    torch.manual_seed(0)
    source = torch.randn(500, 16)  # [N, D']
    rotation, _ = torch.linalg.qr(torch.randn(16, 16))  # [D', D] orthogonal
    found = procrustes(source, source @ rotation + 0.01 * torch.randn(500, 16))
    assert torch.allclose(found, rotation, atol=0.01)
    assert torch.allclose(found @ found.T, torch.eye(16), atol=1e-4)


def test_a_budget_cuts_the_steps_to_what_fits_and_a_resume_keeps_the_cut(tmp_path: Path) -> None:
    weight = torch.nn.Parameter(torch.zeros(1))
    module = torch.nn.Module()
    module.weight = weight
    calls: list[int] = []

    def loss(step: int) -> torch.Tensor:
        calls.append(step)
        time.sleep(0.01)  # a step the probe can time
        return (weight - 1).pow(2).sum()

    opt = torch.optim.SGD([weight], lr=0.1)
    stats = run_steps("budget", {"m": module}, opt, 10_000, 0.05, loss, tmp_path / "c.pt", 10, budget_s=0.5)
    assert 25 <= stats["steps"] < 10_000  # the probe ran, then the total shrank
    assert torch.load(tmp_path / "c.pt", weights_only=False)["total_steps"] == stats["steps"]
    again = run_steps("budget", {"m": module}, opt, 10_000, 0.05, loss, tmp_path / "c.pt", 10)
    assert again["steps"] == stats["steps"] and len(calls) == stats["steps"]  # nothing left to run


def _tiny_bert(layers: int, vocab: int, seed: int) -> tuple[BertConfig, dict[str, np.ndarray]]:
    body = tiny_body(vocab, HIDDEN, layers, seed)
    return body.config, {k: v.numpy().copy() for k, v in body.state_dict().items() if v.is_floating_point()}


@pytest.fixture(scope="module")
def tiny_pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A pack of tiny random BERTs, with MiniLM's tokenizer standing in for both."""
    folder = tmp_path_factory.mktemp("pack")
    tokenizer = minilm_path() / "tokenizer.json"
    vocab = len(json.loads(tokenizer.read_text())["model"]["vocab"])
    words = ["tea", "coffee", "rain", "sun", "dog", "cat", "film", "book", "music", "game", "bread", "rice"]
    turns = [f"do you like {a} or {b}?" for a in words for b in words if a != b][:60]
    pairs = [[i, i + 1] if i % 3 else [i, i + 1, i + 2] for i in range(0, 57)]
    PackTexts(
        turns=turns,
        english_pairs=pairs,
        separator=" | ",
        minilm_separator=" [SEP] ",
        korean_contexts=[f"{w}를 좋아해요?" for w in words],
        korean_replies=[f"네, {w} 좋아요" for w in words],
        broad={"en-prose": turns[:20], "ko-chat": [f"{w} 이야기" for w in words]},
        broad_shares={"en-prose": 0.5, "ko-chat": 0.5},
    ).save(folder / TEXTS_FILE)
    shutil.copy(tokenizer, folder / STUDENT_TOKENIZER)
    _, e5 = _tiny_bert(4, vocab, 0)
    np.savez_compressed(folder / E5_FILE, **to_int8(e5))
    (folder / MINILM_DIR).mkdir()
    shutil.copy(tokenizer, folder / MINILM_DIR / "tokenizer.json")
    config, minilm = _tiny_bert(2, vocab, 1)
    config.to_json_file(str(folder / MINILM_DIR / "config.json"))
    np.savez_compressed(folder / MINILM_FILE, **to_int8(minilm))
    config, _ = _tiny_bert(1, vocab, 0)  # the shape tiny_body gives, read back
    shape = {"hidden": HIDDEN, "layers": 4, "heads": config.num_attention_heads, "vocab": vocab}
    shape |= {"intermediate": config.intermediate_size, "max_positions": config.max_position_embeddings}
    shape |= {"type_vocab": config.type_vocab_size, "eps": config.layer_norm_eps}
    meta = {"e5_shape": shape, "teacher": {"source": "random"}, "separator": " | ", "max_context_turns": 3}
    (folder / "meta.json").write_text(json.dumps(meta))
    return folder


def test_a_run_tunes_the_teacher_fits_the_rotation_and_trains_a_student(tiny_pack: Path, tmp_path: Path) -> None:
    pack = Pack(tiny_pack)
    before = {k: v.copy() for k, v in pack.e5.items()}
    tune = TeacherTune(trained_layers=2, steps=2, batch_size=4, korean_every=2)
    tuned = tune_teacher(pack, tune, tmp_path, "cpu", None)
    assert tuned["train"]["steps"] == 2
    changed = {k for k in before if not np.array_equal(before[k], pack.e5[k])}
    assert changed and all(k.startswith(("encoder.layer.2.", "encoder.layer.3.")) for k in changed)  # the top half

    cfg = LiveConfig(layers=(0, 3), steps=3, batch_size=4, broad_batch_size=6, korean_every=2, checkpoint_every=2)
    teachers = Teachers(pack, cfg, "cpu")
    assert teachers.fit_rotation(pack.texts.turns) > 0  # rotated MiniLM points the way e5 does
    assert torch.allclose(teachers.rotation @ teachers.rotation.T, torch.eye(HIDDEN), atol=1e-4)
    record = train(pack, teachers, cfg, tmp_path, "cpu", None)
    assert record["train"]["steps"] == 3

    student = load_student(pack, cfg.layers, tmp_path / student_file(cfg.layers))
    frozen = student.body.embeddings.word_embeddings.weight.detach().numpy()
    np.testing.assert_array_equal(frozen, pack.e5["embeddings.word_embeddings.weight"])  # never trained
    moved = student.body.encoder.layer[1].attention.self.query.weight.detach().numpy()
    assert not np.allclose(moved, pack.e5["encoder.layer.3.attention.self.query.weight"], atol=1e-4)
    ids = torch.tensor([[101, 2000, 102]])
    context, reply = student(ids, torch.ones_like(ids))
    assert context.shape == reply.shape == (1, HIDDEN)

    # A student file that travelled as int8 rows loads as the fp16 one does, within the rounding.
    small = tmp_path / "small" / student_file(cfg.layers)
    small.parent.mkdir()
    fp16 = np.load(tmp_path / student_file(cfg.layers))
    np.savez(small, **to_int8({k: v.astype(np.float32) for k, v in fp16.items()}))
    travelled = load_student(pack, cfg.layers, small).body.encoder.layer[1].attention.self.query.weight.detach()
    assert torch.allclose(travelled, torch.from_numpy(moved), atol=0.02 * float(np.abs(moved).max()))

    # A second recipe can reuse this run's tuned teacher instead of tuning its own.
    (tmp_path / "run.json").write_text(json.dumps({"teacher_tune": tuned}))
    fresh = Pack(tiny_pack)
    assert lay_teacher(fresh, tmp_path / "teacher-layers.npz") == tuned
    for name in changed:
        np.testing.assert_allclose(fresh.e5[name], pack.e5[name], atol=2e-3)  # fp16 on disk


def test_minilm_english_targets_are_rotated_minilm_and_korean_targets_stay_e5(tiny_pack: Path) -> None:
    pack = Pack(tiny_pack)
    mixed = Teachers(pack, LiveConfig(), "cpu")
    alone = Teachers(pack, LiveConfig(english_targets="minilm"), "cpu")
    alone.minilm, alone.e5 = mixed.minilm, mixed.e5  # the same teachers, two recipes
    mixed.fit_rotation(pack.texts.turns)
    alone.rotation = mixed.rotation
    english = ["do you like tea?", "i like rain"]
    inputs = mixed.inputs(english, "query", english=True)
    minilm = alone._pool(alone.minilm, inputs.minilm) @ alone.rotation  # type: ignore[arg-type]
    assert torch.allclose(alone.targets(inputs), minilm, atol=1e-6)
    assert not torch.allclose(mixed.targets(inputs), minilm, atol=1e-3)  # the mix leans to e5 too
    assert alone.inputs(english, "query", english=True).e5 is None  # e5 reads no English it would not use
    korean = mixed.inputs(["차 좋아해요?"], "query", english=False)
    assert torch.allclose(alone.targets(korean), mixed.targets(korean), atol=1e-6)
