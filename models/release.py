"""`make release`: promote a trained, calibrated and evaluated bundle into the
release folder that git tracks and every fresh clone serves.

    python -m models.release --bundle artifacts/bundles/multilingual-e5-chitchat-en-ko-int8 [--ood reports/ood.json]

The bundle must check out against its own manifest and pass every gate
below, on three kinds of evidence:

- its `make eval` figures (chitchat test split, 1-of-100), in its manifest;
- `reports/ood.json` from `python -m bench.encoders` (or `bench.ood`): the
  human chit-chat dev sets, chatterbot-corpus, the labelled reactions and STS
  through the live API, the candidate and its baselines in one run.

A gate that fails can only be waived by name with a reason
(`--waive GATE=REASON`, repeatable; `make release RELEASE_ARGS="--waive 'GATE=REASON'"`); the
waiver is written into the released manifest, where /info shows it. Nothing
is copied unless the release goes through, and the copy is staged and
renamed into place.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from core.bundle import MANIFEST, RELEASE_BUNDLE, BundleManifest, open_bundle, update_manifest
from core.files import staged_dir

MAX_RELEASE_BYTES = 40 * 1024 * 1024  # the release is tracked in git
MINILM = "minilm-l6-zeroshot-int8"  # the zero-shot baseline the STS floors are read against


@dataclass
class Evidence:
    """What the gates read besides the candidate's manifest."""

    ood: list[dict[str, Any]] = field(default_factory=list)  # reports/ood.json rows

    def row(self, bundle: str, kind: str, checksum: str | None = None) -> dict[str, Any] | None:
        """The bench.ood row of `bundle` on set `kind`; the candidate's must carry its checksum."""
        for r in self.ood:
            if r["bundle"] == bundle and r["set"] == kind and (checksum is None or r.get("checksum") == checksum):
                return r
        return None


Measure = Callable[[BundleManifest, Evidence], tuple[float | None, bool]]


@dataclass(frozen=True)
class Gate:
    name: str
    bar: str
    measure: Measure


def _figure(manifest: BundleManifest, key: str) -> float | None:
    value = manifest.eval.get(key)
    return float(value) if isinstance(value, int | float) else None


def _at_least(key: str, bar: float) -> Measure:
    def measure(candidate: BundleManifest, _: Evidence) -> tuple[float | None, bool]:
        value = _figure(candidate, key)
        return value, value is not None and value >= bar

    return measure


def _ood(kind: str, figure: str, baseline: Callable[[Evidence], float | None], margin: float) -> Measure:
    """The candidate's `figure` on `kind` minus the baseline's; passes at `margin` or above."""

    def measure(candidate: BundleManifest, evidence: Evidence) -> tuple[float | None, bool]:
        row = evidence.row(candidate.name, kind, candidate.checksum)
        base = baseline(evidence)
        if row is None or base is None:
            return None, False
        gap = round(float(row[figure]) - base, 4)
        return gap, gap >= margin - 1e-9

    return measure


def _of(bundle: str, kind: str, figure: str) -> Callable[[Evidence], float | None]:
    def value(evidence: Evidence) -> float | None:
        row = evidence.row(bundle, kind)
        return None if row is None else float(row[figure])

    return value


def _candidate_rows(kind_prefix: str, check: Callable[[dict[str, Any]], bool], figure: str) -> Measure:
    """Every candidate row whose set starts with `kind_prefix` passes `check`; the value is the worst `figure`."""

    def measure(candidate: BundleManifest, evidence: Evidence) -> tuple[float | None, bool]:
        rows = [
            r
            for r in evidence.ood
            if r["set"].startswith(kind_prefix)
            and r["bundle"] == candidate.name
            and r.get("checksum") == candidate.checksum
        ]
        if not rows:
            return None, False
        worst = max(rows, key=lambda r: float(r[figure])) if figure != "fits" else min(rows, key=lambda r: r[figure])
        return float(worst[figure]), all(check(r) for r in rows)

    return measure


def _ood_at_least(kind: str, figure: str, bar: float, half: str = "") -> Measure:
    """The candidate's `figure` on `kind` (on `half`'s contexts, "half_b", where given) is at least `bar`."""

    def measure(candidate: BundleManifest, evidence: Evidence) -> tuple[float | None, bool]:
        row = evidence.row(candidate.name, kind, candidate.checksum)
        if row is None or (half and half not in row):
            return None, False
        value = float((row[half] if half else row)[figure])
        return value, value >= bar - 1e-9

    return measure


def _no_echo(candidate: BundleManifest, _: Evidence) -> tuple[float | None, bool]:
    value = _figure(candidate, "served_echo_share")
    return value, value == 0.0


def _reaction_share(candidate: BundleManifest, _: Evidence) -> tuple[float | None, bool]:
    share = candidate.calibration.get("shares", {}).get("reaction")
    return share, isinstance(share, float) and 0.07 <= share <= 0.13


def _clean(candidate: BundleManifest, evidence: Evidence) -> tuple[float | None, bool]:
    """No chatterbot-corpus in its training: every bench row of it says so."""
    rows = [r for r in evidence.ood if r["bundle"] == candidate.name and r.get("checksum") == candidate.checksum]
    return None, bool(rows) and not any(r["trained_on_chatterbot"] for r in rows)


# The encoder is chosen on human chit-chat, half B reported against a bar;
# chatterbot and STS are floors. Our own written Korean dev set is reported by `make eval`, not
# gated: a gain that shows only on data we wrote is not yet a gain.
GATES = (
    Gate("chitchat_r_at_1", "chitchat test 1-of-100 R@1 >= 0.42", _at_least("r_at_1", 0.42)),
    Gate(
        "topical_chat",
        "Topical-Chat valid half B R@1 >= 0.15 (live API, 1-of-1,000)",
        _ood_at_least("topical_chat_valid", "r_at_1", 0.15, "half_b"),
    ),
    Gate(
        "chatbotdata_ko",
        "ChatbotData KO dev half B R@1 >= 0.095 (live API, 1-of-2,000)",
        _ood_at_least("chatbotdata_ko_dev", "r_at_1", 0.095, "half_b"),
    ),
    Gate("sts_korean", "/similar Spearman on KorSTS dev >= 78", _ood_at_least("korsts_dev", "spearman", 78.0)),
    Gate(
        "sts_headlines",
        "/similar Spearman on STS-15 headlines - zero-shot MiniLM-L6's (same run) >= -2",
        _ood("sts15_headlines", "spearman", _of(MINILM, "sts15_headlines", "spearman"), -2.0),
    ),
    Gate(
        "sts_images",
        "/similar Spearman on STS-15 image captions - zero-shot MiniLM-L6's (same run) >= -2",
        _ood("sts15_images", "spearman", _of(MINILM, "sts15_images", "spearman"), -2.0),
    ),
    Gate("no_chatterbot", "no chatterbot-corpus text in its training (the out-of-domain dev set)", _clean),
    Gate(
        "ood_reaction_share",
        "reactions answer <= 15% of chatterbot turns (each language)",
        _candidate_rows("chatterbot-", lambda r: r["reaction_share"] <= 0.15, "reaction_share"),
    ),
    # The bar: no reaction contradicts the turn. The share that fits is the value, reported, not
    # gated: a class that takes no side ("oh I see") is a safe answer to news of either kind.
    Gate(
        "reactions_fit",
        "no reaction contradicts our labelled utterances (each language); value: the lowest share that fits",
        _candidate_rows("reactions-labelled-", lambda r: r["wrong"] == 0, "fits"),
    ),
    Gate("no_echo", "no served answer is a near copy of a context turn (chitchat test)", _no_echo),
    Gate("reaction_share", "about 10% of validation turns go to reactions", _reaction_share),
)


class ReleaseRefused(Exception):
    pass


def check(candidate: BundleManifest, evidence: Evidence, waivers: dict[str, str]) -> list[dict[str, Any]]:
    unknown = set(waivers) - {g.name for g in GATES}
    if unknown:
        raise ReleaseRefused(f"no such gate: {sorted(unknown)}")
    results = []
    for gate in GATES:
        value, passed = gate.measure(candidate, evidence)
        result: dict[str, Any] = {"gate": gate.name, "bar": gate.bar, "value": value, "passed": passed}
        if not passed and gate.name in waivers:
            result["waived"] = waivers[gate.name]
        results.append(result)
    return results


def promote(bundle: Path, evidence: Evidence, waivers: dict[str, str], target: Path = RELEASE_BUNDLE) -> BundleManifest:
    """Checks the gates, then replaces `target` with a copy of `bundle`. Raises ReleaseRefused."""
    candidate = open_bundle(bundle)  # a bundle whose files do not match its manifest stops here
    if not candidate.servable:
        raise ReleaseRefused(f"{candidate.name} is not a servable bundle")
    if candidate.confidence is None or not candidate.calibration:
        raise ReleaseRefused(f"{candidate.name} is not calibrated: run `python -m models.calibrate` first")
    results = check(candidate, evidence, waivers)
    blocking = [r for r in results if not r["passed"] and "waived" not in r]
    for r in results:
        status = "pass" if r["passed"] else ("WAIVED: " + r["waived"] if "waived" in r else "FAIL")
        print(f"[release] {r['gate']:<20} {r['value']!s:<8} {r['bar']}: {status}")
    if blocking:
        raise ReleaseRefused(f"{len(blocking)} gates failed: {', '.join(r['gate'] for r in blocking)}")
    size = sum(p.stat().st_size for p in bundle.iterdir() if p.is_file())
    if size > MAX_RELEASE_BYTES:
        raise ReleaseRefused(f"{size / 2**20:.1f} MiB is over the {MAX_RELEASE_BYTES / 2**20:.0f} MiB release limit")

    with staged_dir(target) as staging:
        for name in [*candidate.files, MANIFEST]:
            shutil.copy2(bundle / name, staging / name)
        release = {
            "released_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "from": str(bundle),
            "gates": results,
        }
        released = update_manifest(staging, release=release)
        open_bundle(staging)  # the copy checks out before it replaces anything
    print(f"[release] {released.name} ({released.checksum[:12]}) -> {target}")
    return released


def _waiver(text: str) -> tuple[str, str]:
    name, _, reason = text.partition("=")
    if not reason.strip():
        raise argparse.ArgumentTypeError("--waive takes GATE=REASON, with a reason")
    return name.strip(), reason.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bundle", type=Path, default=Path("artifacts/bundles/multilingual-e5-chitchat-en-ko-int8"))
    parser.add_argument("--ood", type=Path, default=Path("reports/ood.json"), help="python -m bench.ood's rows")
    parser.add_argument("--target", type=Path, default=RELEASE_BUNDLE)
    parser.add_argument("--waive", type=_waiver, action="append", default=[], metavar="GATE=REASON")
    parser.add_argument("--check", action="store_true", help="print the gates; promote nothing")
    args = parser.parse_args()
    ood = json.loads(args.ood.read_text()) if args.ood.is_file() else []
    evidence = Evidence(ood)
    try:
        if args.check:
            for r in check(open_bundle(args.bundle), evidence, dict(args.waive)):
                print(f"[release] {r['gate']:<20} {r['value']!s:<8} {r['bar']}: {'pass' if r['passed'] else 'FAIL'}")
            return
        promote(args.bundle, evidence, dict(args.waive), args.target)
    except ReleaseRefused as error:
        sys.exit(f"[release] refused: {error}")


if __name__ == "__main__":
    main()
