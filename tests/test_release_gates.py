"""models/release.py's gates on synthetic evidence: which figures they read, and that a missing one fails."""

from __future__ import annotations

from typing import Any

from core.bundle import BundleManifest
from models.release import E5, MINILM, MULTILINGUAL_BEFORE, Evidence, check


def candidate(**eval_figures: float) -> BundleManifest:
    return BundleManifest(
        name="student", model_id="m", kind="student", dim=8, num_layers=6, max_context_tokens=96,
        max_reply_tokens=96, max_context_turns=3, turn_separator=" | ", quantization="int8", files={},
        checksum="abc", eval=dict(eval_figures), calibration={"shares": {"reaction": 0.1}},
    )  # fmt: skip


def row(bundle: str, kind: str, checksum: str | None = None, **figures: Any) -> dict[str, Any]:
    return {"model": bundle, "bundle": bundle, "set": kind, **({"checksum": checksum} if checksum else {}), **figures}


def evidence(english: float = 0.30, fits: float = 0.95, share: float = 0.1) -> Evidence:
    ours = {"checksum": "abc"}
    return Evidence(
        ood=[
            row(MINILM, "chatterbot-en", r_at_1=0.287),
            row(E5, "chatterbot-en", r_at_1=0.20),
            row(E5, "chatterbot-ko", r_at_1=0.14),
            row(MINILM, "sts15_headlines", spearman=84.0),
            row(MINILM, "sts15_images", spearman=93.0),
            row(MULTILINGUAL_BEFORE, "korsts_dev", spearman=79.2),
            row("student", "chatterbot-en", **ours, r_at_1=english, reaction_share=share),
            row("student", "chatterbot-ko", **ours, r_at_1=0.2, reaction_share=0.05),
            row("student", "sts15_headlines", **ours, spearman=84.5),
            row("student", "sts15_images", **ours, spearman=92.9),
            row("student", "korsts_dev", **ours, spearman=79.5),
            row("student", "reactions-labelled-en", **ours, fits=fits, contradicts=0),
            row("student", "reactions-labelled-ko", **ours, fits=0.92, contradicts=0),
        ],
        korean={
            "student": {"r_at_1": 0.28, "far_r_at_1": 0.30},
            E5: {"r_at_1": 0.15, "far_r_at_1": 0.19},
            MULTILINGUAL_BEFORE: {"r_at_1": 0.273, "far_r_at_1": 0.29},
        },
    )


def results(manifest: BundleManifest, found: Evidence) -> dict[str, dict[str, Any]]:
    return {r["gate"]: r for r in check(manifest, found, {})}


def test_each_gate_reads_its_own_baseline_from_the_same_run() -> None:
    gates = results(candidate(r_at_1=0.46, served_echo_share=0.0), evidence())
    assert gates["ood_english"]["value"] == 0.013 and gates["ood_english"]["passed"]  # against the best zero-shot
    assert gates["ood_korean"]["passed"] and gates["korean_dev"]["passed"] and gates["korean_dev_far"]["passed"]
    assert gates["sts_headlines"]["passed"] and gates["sts_korean"]["passed"]
    assert not gates["sts_images"]["passed"] and gates["sts_images"]["value"] == -0.1  # 92.9 against MiniLM's 93.0
    assert gates["chitchat_r_at_1"]["passed"] and gates["reactions_fit"]["passed"]


def test_the_english_bar_allows_a_hundredth_below_zero_shot_and_no_more() -> None:
    assert results(candidate(), evidence(english=0.278))["ood_english"]["passed"]
    assert not results(candidate(), evidence(english=0.276))["ood_english"]["passed"]


def test_reaction_gates_hold_in_every_language() -> None:
    assert not results(candidate(), evidence(fits=0.89))["reactions_fit"]["passed"]
    assert not results(candidate(), evidence(share=0.16))["ood_reaction_share"]["passed"]


def test_rows_of_another_build_of_the_candidate_do_not_count() -> None:
    other = candidate()
    other.checksum = "a bundle rebuilt since bench.ood ran"
    gates = results(other, evidence())
    assert gates["ood_english"]["value"] is None and not gates["ood_english"]["passed"]


def test_no_evidence_fails_every_gate_that_needs_it() -> None:
    gates = results(candidate(r_at_1=0.5, served_echo_share=0.0), Evidence())
    needs = {"ood_english", "ood_korean", "sts_headlines", "sts_images", "sts_korean", "korean_dev", "korean_dev_far"}
    assert all(not gates[name]["passed"] and gates[name]["value"] is None for name in needs)
