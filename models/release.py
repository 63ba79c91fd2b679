"""`make release`: promote a trained, calibrated and evaluated bundle into the
release folder that git tracks and every fresh clone serves.

    python -m models.release --bundle artifacts/bundles/chitchat-student-l3-int8

The bundle must check out against its own manifest, and its `make eval`
figures must pass every gate below. A gate that fails can only be waived by
name with a reason (`--waive rerank_gain="..."`); the waiver is written into
the released manifest, where /info shows it. Nothing is copied unless the
release goes through, and the copy is staged and renamed into place.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from app.core.bundle import MANIFEST, RELEASE_BUNDLE, BundleManifest, open_bundle, update_manifest

MAX_RELEASE_BYTES = 40 * 1024 * 1024  # the release is tracked in git


@dataclass(frozen=True)
class Gate:
    name: str
    bar: str
    # (value, passed) from the student's and the teacher's manifests
    measure: Callable[[BundleManifest, BundleManifest], tuple[float | None, bool]]


def _figure(manifest: BundleManifest, key: str) -> float | None:
    value = manifest.eval.get(key)
    return float(value) if isinstance(value, int | float) else None


def _at_least(key: str, bar: float) -> Callable[[BundleManifest, BundleManifest], tuple[float | None, bool]]:
    def measure(student: BundleManifest, _: BundleManifest) -> tuple[float | None, bool]:
        value = _figure(student, key)
        return value, value is not None and value >= bar

    return measure


def _teacher_gap(student: BundleManifest, teacher: BundleManifest) -> tuple[float | None, bool]:
    s, t = _figure(student, "r_at_1"), _figure(teacher, "r_at_1")
    if s is None or t is None:
        return None, False
    return round(t - s, 4), t - s <= 0.015


def _fallback_ratio(student: BundleManifest, _: BundleManifest) -> tuple[float | None, bool]:
    handed, kept = _figure(student, "fallback_r_at_1_handed_to_reactions"), _figure(student, "fallback_r_at_1_kept")
    if handed is None or not kept:
        return None, False
    return round(handed / kept, 4), handed / kept <= 0.5


def _no_echo(student: BundleManifest, _: BundleManifest) -> tuple[float | None, bool]:
    value = _figure(student, "served_echo_share")
    return value, value == 0.0


def _reaction_share(student: BundleManifest, _: BundleManifest) -> tuple[float | None, bool]:
    share = student.calibration.get("shares", {}).get("reaction")
    return share, isinstance(share, float) and 0.07 <= share <= 0.13


GATES = (
    Gate("student_r_at_1", "student int8 1-of-100 R@1 >= 0.45 (test)", _at_least("r_at_1", 0.45)),
    Gate("teacher_gap", "teacher fp32 R@1 - student int8 R@1 <= 0.015 (test)", _teacher_gap),
    Gate("rerank_gain", "poly rerank adds >= 0.02 R@1 (test)", _at_least("rerank_gain", 0.02)),
    Gate(
        "confidence_auroc",
        "confidence AUROC >= 0.70 for an acceptable top reply (test)",
        _at_least("confidence_auroc", 0.70),
    ),
    Gate("fallback_ratio", "R@1 on turns handed to reactions <= half the R@1 kept (test)", _fallback_ratio),
    Gate("no_echo", "no served answer is a near copy of a context turn (test)", _no_echo),
    Gate("reaction_share", "about 10% of validation turns go to reactions", _reaction_share),
)


class ReleaseRefused(Exception):
    pass


def check(student: BundleManifest, teacher: BundleManifest, waivers: dict[str, str]) -> list[dict[str, Any]]:
    unknown = set(waivers) - {g.name for g in GATES}
    if unknown:
        raise ReleaseRefused(f"no such gate: {sorted(unknown)}")
    results = []
    for gate in GATES:
        value, passed = gate.measure(student, teacher)
        result: dict[str, Any] = {"gate": gate.name, "bar": gate.bar, "value": value, "passed": passed}
        if not passed and gate.name in waivers:
            result["waived"] = waivers[gate.name]
        results.append(result)
    return results


def promote(bundle: Path, teacher: Path, waivers: dict[str, str], target: Path = RELEASE_BUNDLE) -> BundleManifest:
    """Checks the gates, then replaces `target` with a copy of `bundle`. Raises ReleaseRefused."""
    student = open_bundle(bundle)  # a bundle whose files do not match its manifest stops here
    if not student.servable:
        raise ReleaseRefused(f"{student.name} is not a servable bundle")
    if student.confidence is None or not student.calibration:
        raise ReleaseRefused(f"{student.name} is not calibrated: run `python -m models.calibrate` first")
    results = check(student, open_bundle(teacher), waivers)
    blocking = [r for r in results if not r["passed"] and "waived" not in r]
    for r in results:
        status = "pass" if r["passed"] else ("WAIVED: " + r["waived"] if "waived" in r else "FAIL")
        print(f"[release] {r['gate']:<18} {r['value']!s:<8} {r['bar']}: {status}")
    if blocking:
        raise ReleaseRefused(f"{len(blocking)} gates failed: {', '.join(r['gate'] for r in blocking)}")
    size = sum(p.stat().st_size for p in bundle.iterdir() if p.is_file())
    if size > MAX_RELEASE_BYTES:
        raise ReleaseRefused(f"{size / 2**20:.1f} MiB is over the {MAX_RELEASE_BYTES / 2**20:.0f} MiB release limit")

    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        for name in [*student.files, MANIFEST]:
            shutil.copy2(bundle / name, staging / name)
        release = {
            "released_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "from": str(bundle),
            "teacher": {"name": open_bundle(teacher).name, "r_at_1": _figure(open_bundle(teacher), "r_at_1")},
            "gates": results,
        }
        released = update_manifest(staging, release=release)
        open_bundle(staging)  # the copy checks out before it replaces anything
        old = target.with_name(f".{target.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        if target.exists():
            target.rename(old)
        staging.rename(target)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    print(f"[release] {released.name} ({released.checksum[:12]}) -> {target}")
    return released


def _waiver(text: str) -> tuple[str, str]:
    name, _, reason = text.partition("=")
    if not reason.strip():
        raise argparse.ArgumentTypeError("--waive takes GATE=REASON, with a reason")
    return name.strip(), reason.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bundle", type=Path, default=Path("artifacts/bundles/chitchat-student-l3-int8"))
    parser.add_argument("--teacher", type=Path, default=Path("artifacts/bundles/chitchat-teacher-l6-fp32"))
    parser.add_argument("--target", type=Path, default=RELEASE_BUNDLE)
    parser.add_argument("--waive", type=_waiver, action="append", default=[], metavar="GATE=REASON")
    args = parser.parse_args()
    try:
        promote(args.bundle, args.teacher, dict(args.waive), args.target)
    except ReleaseRefused as error:
        sys.exit(f"[release] refused: {error}")


if __name__ == "__main__":
    main()
