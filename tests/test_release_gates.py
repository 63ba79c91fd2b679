"""models/release.py's gates on synthetic evidence: which figures they read, and that a missing one fails."""

from __future__ import annotations

from typing import Any

from core.bundle import BundleManifest
from models.release import MINILM, Evidence, check


def candidate(**eval_figures: float) -> BundleManifest:
    return BundleManifest(
        name="student", model_id="m", kind="student", dim=8, num_layers=6, max_context_tokens=96,
        max_reply_tokens=96, max_context_turns=3, turn_separator=" | ", quantization="int8", files={},
        checksum="abc", eval=dict(eval_figures), calibration={"shares": {"reaction": 0.1}},
    )  # fmt: skip


def row(bundle: str, kind: str, checksum: str | None = None, **figures: Any) -> dict[str, Any]:
    return {
        "model": bundle,
        "bundle": bundle,
        "set": kind,
        "trained_on_chatterbot": figures.pop("chatterbot", False),
        **({"checksum": checksum} if checksum else {}),
        **figures,
    }


def halves(b: float) -> dict[str, Any]:
    """A reply set's figures whose half A reads far better than half B: only half B may count."""
    return {"r_at_1": 0.5, "half_a": {"r_at_1": 0.9}, "half_b": {"r_at_1": b}}


def evidence(
    topical: float = 0.16,
    wrong: int = 0,
    share: float = 0.1,
    korsts: float = 79.0,
    chatterbot: bool = False,
) -> Evidence:
    ours = {"checksum": "abc", "chatterbot": chatterbot}
    return Evidence(
        ood=[
            row(MINILM, "sts15_headlines", spearman=84.0),
            row(MINILM, "sts15_images", spearman=93.0),
            row("student", "topical_chat_valid", **ours, **halves(topical)),
            row("student", "chatbotdata_ko_dev", **ours, **halves(0.1)),
            row("student", "chatterbot-en", **ours, r_at_1=0.2, reaction_share=share),
            row("student", "chatterbot-ko", **ours, r_at_1=0.2, reaction_share=0.05),
            row("student", "sts15_headlines", **ours, spearman=82.0),
            row("student", "sts15_images", **ours, spearman=90.9),
            row("student", "korsts_dev", **ours, spearman=korsts),
            row("student", "reactions-labelled-en", **ours, fits=0.4, wrong=wrong),
            row("student", "reactions-labelled-ko", **ours, fits=0.92, wrong=0),
        ]
    )


def results(manifest: BundleManifest, found: Evidence) -> dict[str, dict[str, Any]]:
    return {r["gate"]: r for r in check(manifest, found, {})}


def test_each_gate_reads_its_own_figure() -> None:
    gates = results(candidate(r_at_1=0.43, served_echo_share=0.0), evidence())
    assert all(g["passed"] for name, g in gates.items() if name != "sts_images"), gates
    assert gates["topical_chat"]["value"] == 0.16  # half B, not half A's 0.9 nor the whole set's 0.5
    assert gates["sts_headlines"]["value"] == -2.0  # 82.0 against MiniLM's 84.0, in the same run: the bar
    assert not gates["sts_images"]["passed"] and gates["sts_images"]["value"] == -2.1


def test_human_chit_chat_bars_are_read_on_half_b() -> None:
    assert not results(candidate(), evidence(topical=0.149))["topical_chat"]["passed"]
    assert not results(candidate(), evidence(korsts=77.9))["sts_korean"]["passed"]
    assert not results(candidate(r_at_1=0.419), evidence())["chitchat_r_at_1"]["passed"]


def test_a_bundle_that_saw_chatterbot_is_refused() -> None:
    assert not results(candidate(), evidence(chatterbot=True))["no_chatterbot"]["passed"]


def test_reaction_gates_hold_in_every_language() -> None:
    assert not results(candidate(), evidence(wrong=1))["reactions_fit"]["passed"]
    assert results(candidate(), evidence())["reactions_fit"]["value"] == 0.4  # the lowest share that fits, reported
    assert not results(candidate(), evidence(share=0.16))["ood_reaction_share"]["passed"]


def test_rows_of_another_build_of_the_candidate_do_not_count() -> None:
    other = candidate()
    other.checksum = "a bundle rebuilt since the bench ran"
    gates = results(other, evidence())
    assert gates["topical_chat"]["value"] is None and not gates["topical_chat"]["passed"]
    assert not gates["no_chatterbot"]["passed"]


def test_no_evidence_fails_every_gate_that_needs_it() -> None:
    gates = results(candidate(r_at_1=0.5, served_echo_share=0.0), Evidence())
    needs = {"topical_chat", "chatbotdata_ko", "sts_headlines", "sts_images", "sts_korean", "reactions_fit"}
    assert all(not gates[name]["passed"] and gates[name]["value"] is None for name in needs)
    assert not gates["no_chatterbot"]["passed"]
