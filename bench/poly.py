"""Does the poly head earn its place? Reply matching with and without the rerank, through the live API.

    python -m bench.poly --bundle DIR      # a bundle with a poly head -> reports/poly.{md,json}

For each human chit-chat dev set (models/ood.py) every distinct reply is uploaded as the only
candidates, and each context asks `/reply` with reply matching alone, k = 10, every context
with `"rerank": false`, then every one with `"rerank": true`. R@1 is reported on half A (where
the head's weight was chosen) and half B; the p50 is the client's, one request at a time. No
shipped bundle has a poly head: the one this last judged, and the recipe that trained it, are in
docs/experiments.md.

The rule the service follows (app/config.py's rerank default, the bundle's manifest):
- on by default where the rerank gains at least `DEFAULT_GAIN` R@1 on half B of both sets,
  at no more than `MAX_P50_MS` p50;
- opt-in (`"rerank": true`) where it gains less on either, but more than zero on both;
- removed from serving otherwise.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from bench.ood import reply_figures, service, upload
from bench.reports import write
from bench.service import cpu_description
from core.bundle import open_bundle
from models.ood import available_human, human_set

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_GAIN = 0.01  # R@1 on half B of each human set
MAX_P50_MS = 2.0  # what the rerank may add to a request's p50


def verdict(sets: dict[str, dict[str, Any]]) -> str:
    gains = [s["gain_half_b"] for s in sets.values()]
    cost = max(s["p50_cost_ms"] for s in sets.values())
    if all(g >= DEFAULT_GAIN for g in gains) and cost <= MAX_P50_MS:
        return "on by default"
    if all(g > 0 for g in gains):
        return "opt-in"
    return "removed"


def measure(bundle: Path) -> dict[str, Any]:
    manifest = open_bundle(bundle)
    if manifest.poly is None:
        raise SystemExit(f"{bundle}: no poly head")
    sets: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as work, service(bundle, Path(work)) as client:
        for name in available_human():
            data = human_set(name)
            upload(client, data.replies, data.language)
            off = reply_figures(client, data, reactions=False, rerank=False)
            on = reply_figures(client, data, reactions=False, rerank=True)
            sets[name] = {
                "off": off,
                "on": on,
                "gain_half_a": round(on["half_a"]["r_at_1"] - off["half_a"]["r_at_1"], 4),
                "gain_half_b": round(on["half_b"]["r_at_1"] - off["half_b"]["r_at_1"], 4),
                "p50_cost_ms": round(on["p50_ms"] - off["p50_ms"], 2),
            }
            print(name, {k: v for k, v in sets[name].items() if k not in ("off", "on")}, flush=True)
    return {
        "bundle": manifest.name,
        "checksum": manifest.checksum,
        "poly": {"codes": manifest.poly.codes, "weight": manifest.poly.weight},
        "sets": sets,
        "verdict": verdict(sets),
        "rule": f"on: >= +{DEFAULT_GAIN} half-B R@1 on both sets at <= +{MAX_P50_MS} ms p50; opt-in: > 0 on both",
    }


def markdown(report: dict[str, Any]) -> str:
    lines = [
        "# The poly head: reply matching with and without the rerank, through the live API",
        "",
        f"`{report['command']}` on {report['cpu']}; bundle `{report['bundle']}` "
        f"(m = {report['poly']['codes']}, w = {report['poly']['weight']}, chosen on half A).",
        "",
        "| set | half A off → on | half B off → on | gain B | p50 off → on (ms) |",
        "|---|---|---|---|---|",
    ]
    for name, s in report["sets"].items():
        a = f"{s['off']['half_a']['r_at_1']:.4f} → {s['on']['half_a']['r_at_1']:.4f}"
        b = f"{s['off']['half_b']['r_at_1']:.4f} → {s['on']['half_b']['r_at_1']:.4f}"
        lines.append(f"| {name} | {a} | {b} | {s['gain_half_b']:+.4f} | {s['off']['p50_ms']} → {s['on']['p50_ms']} |")
    lines += ["", f"Rule: {report['rule']}. **Verdict: {report['verdict']}.**", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bundle", type=Path, required=True)
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "poly")
    args = parser.parse_args()
    report = {
        "command": f"python -m bench.poly --bundle {args.bundle}",
        "cpu": cpu_description(),
        **measure(args.bundle),
    }
    write(args.out, report, markdown(report))


if __name__ == "__main__":
    main()
