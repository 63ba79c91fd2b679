"""The MiniLM recipe's library (models/minilm/pack.py, models/align.py, models/loop.py): the pack's
transport and texts, the maps between two models' spaces, and a step budget that a resume keeps."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import torch

from models.align import fit_map, procrustes, shared_words
from models.loop import run_steps
from models.minilm.pack import TEXTS_FILE, PackTexts, from_int8, to_int8

pytestmark = pytest.mark.training


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


def test_shared_words_pair_word_starts_and_continuations_as_wordpiece_spells_them() -> None:
    student = {"▁hello": 0, "▁Hello": 1, "ing": 2, "▁": 3, "s": 4, "▁zzq": 5, "▁a": 6}
    minilm = {"hello": 10, "##ing": 11, "##s": 12, "[UNK]": 13, "a": 14}
    # A cased piece finds no uncased word; a bare "▁" and one-letter words are left out.
    assert shared_words(student, minilm) == [(0, 10), (2, 11), (4, 12)]
    # In the student's id order whatever order the vocabulary comes in: the map's inputs are fixed.
    assert shared_words(dict(reversed(student.items())), minilm) == [(0, 10), (2, 11), (4, 12)]


def test_the_map_recovers_a_linear_relation_between_the_tables() -> None:
    torch.manual_seed(0)
    source = torch.randn(200, 8)  # [N, De]
    truth = torch.randn(8, 6)  # [De, D]
    assert torch.allclose(fit_map(source, source @ truth), truth, atol=1e-4)


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


def test_a_recorded_probe_replays_the_budgeted_schedule_whatever_the_machine_speed(tmp_path: Path) -> None:
    """A rebuild of a budgeted run: the same learning rates step for step, on a machine of any speed."""

    def run(work: Path, sleep_s: float, probed_total: int | None) -> list[float]:
        weight = torch.nn.Parameter(torch.zeros(1))
        module = torch.nn.Module()
        module.weight = weight
        opt = torch.optim.SGD([weight], lr=0.1)
        rates: list[float] = []

        def loss(step: int) -> torch.Tensor:
            rates.append(opt.param_groups[0]["lr"])
            time.sleep(sleep_s)
            return (weight - 1).pow(2).sum()

        run_steps("probe", {"m": module}, opt, 400, 0.05, loss, work / "c.pt", 1000, 0.4, probed_total)
        return rates

    timed = run(tmp_path / "timed", 0.01, None)  # the original run: its probe shrinks 400 to what fits 0.4 s
    assert 25 <= len(timed) < 400
    replayed = run(tmp_path / "replayed", 0.0, len(timed))  # a far faster machine would fit all 400
    assert replayed == timed
