"""The reaction share a stream of turns gets on a candidate set the bundle was not calibrated on.

    python -m bench.reaction_share [--turns 2000]

The service hands the least confident `CHITCHAT_REACTION_SHARE` of turns to
reactions. Until `warmup` turns of an index version are in, a fixed threshold
decides; after that, the quantile of the version's own recent turns does
(`core.confidence.ShareThreshold`). This replays held-out turns in a fixed
random order, in process, through reply matching as the service runs it, and
prints the share of them that went to reactions, over the first 50, 100 and
300 turns and over all, for each way to start:

- validation: the bundle's threshold, fitted on validation turns against the
  candidates it was calibrated with, for 200 turns (the service before);
- stored replies: the version's own stored replies said as contexts
  (`index/confidence.py`), for 20 turns (the service now).

Sets: each split's own replies as the only candidates (as a user who uploads
their replies), with its contexts; the served chitchat index with validation
contexts. Our Korean dev set is written by us; the chitchat corpus is not.
chatterbot-corpus is left to `bench.ood`, which gates on it.
Writes reports/reaction_share.{md,json}.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from app.config import Settings
from app.engine.runtime import Model, load_model, serve
from bench import reports
from core import confidence
from core.bundle import RELEASE_BUNDLE
from core.confidence import WARMUP_TURNS, ShareThreshold
from core.machine import cpu
from core.records import Candidate
from core.retriever import Avoid, Serving, reply_matching
from core.store import IndexStore
from index.build import build_version
from index.corpus import load_pairs
from models.evalset import korean_rows

ROOT = Path(__file__).resolve().parents[1]
SHARE = 0.10  # the service's default CHITCHAT_REACTION_SHARE
PREFIXES = (50, 100, 300)


@dataclass(frozen=True)
class Start:
    name: str
    fallback: float  # the threshold until `warmup` turns are in
    warmup: int


def turns_of(name: str) -> tuple[list[list[str]], list[str]]:
    """(contexts, their replies) of a set."""
    if name == "korean-dev":
        rows = korean_rows()
        return [r["context"] for r in rows], [r["reply"] for r in rows]
    pairs = load_pairs(name.removeprefix("chitchat-"), max_context_turns=3)
    return [list(p.context) for p in pairs], [p.reply for p in pairs]


def confidences(serving: Serving, turns: list[list[str]]) -> np.ndarray:
    """[N] reply matching's confidence for each context, as `core.retriever.walk` computes it."""
    assert serving.confidence is not None
    window = serving.bundle.max_context_turns
    vectors = serving.encoder.encode([serving.encoder.join_context(t) for t in turns], "context")  # [N, D]
    out = []
    for context, vector in zip(turns, vectors, strict=True):
        said = context[-window:]
        hits = reply_matching(serving, vector, confidence.DEPTH, Avoid.of(said))
        out.append(serving.confidence(confidence.features([h.score for h in hits], said, hits[0].text)))
    return np.array(out)  # [N]


def replay(values: np.ndarray, start: Start) -> np.ndarray:
    """[N] whether each turn, in order, went to reactions."""
    share = ShareThreshold(SHARE, start.fallback, warmup=start.warmup)
    fired = []
    for value in values.tolist():
        share.observe(value)  # as `walk` does: observed, then the threshold read
        fired.append(value < share.threshold())
    return np.array(fired)


def uploaded(model: Model, replies: list[str], work: Path, settings: Settings) -> Serving:
    """The bundle over an index version of `replies` alone, built as an upload builds one."""
    store = IndexStore(work)
    candidates = [Candidate(reply=r, id=f"r{i}") for i, r in enumerate(dict.fromkeys(replies))]
    manifest = build_version(candidates, model.encoder, model.bundle.checksum, store, source="bench", progress=False)
    return serve(model, store.load(manifest.version), settings)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=2000, help="contexts replayed per set, at most")
    parser.add_argument("--artifacts", type=Path, default=ROOT / "artifacts")
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "reaction_share")
    args = parser.parse_args()
    settings = Settings(artifacts_dir=args.artifacts, bundle_dir=RELEASE_BUNDLE)
    model = load_model(settings)
    if model.confidence is None:
        raise SystemExit(f"{model.bundle.name} has no confidence model: no share to hold")
    store = IndexStore(settings.indexes_root)
    version = store.latest_for(model.bundle.checksum)
    if version is None:
        raise SystemExit("no index for the release bundle: run `make index` first")
    served = serve(model, store.load(version), settings)
    if served.share is None:
        raise SystemExit("CHITCHAT_REACTION_SHARE_WINDOW=0: no rolling share to start")
    validation = model.confidence.threshold_for_share(SHARE)
    rng = np.random.default_rng(0)
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for name in ("chitchat-validation", "chitchat-test", "korean-dev", "served index"):
            contexts, replies = turns_of("chitchat-validation" if name == "served index" else name)
            order = rng.permutation(len(contexts))[: args.turns]
            serving = served if name == "served index" else uploaded(model, replies, Path(work) / name, settings)
            values = confidences(serving, [contexts[i] for i in order])
            assert serving.share is not None  # the same settings as `served`
            for start in (
                Start("validation, 200 turns", validation, 200),
                # What `serve` starts this version's rolling share from now: its stored replies' threshold.
                Start(f"stored replies, {WARMUP_TURNS} turns", serving.share.fallback, WARMUP_TURNS),
            ):
                fired = replay(values, start)
                rows.append(
                    {
                        "set": name,
                        "candidates": serving.index.manifest.replies,
                        "start": start.name,
                        "fallback": round(start.fallback, 4),
                        "fallback_alone": round(float((values < start.fallback).mean()), 3),  # never warm
                        **{f"first_{n}": round(float(fired[:n].mean()), 3) for n in PREFIXES if n < len(fired)},
                        "all": round(float(fired.mean()), 3),
                        "turns": len(fired),
                    }
                )
                print(rows[-1], file=sys.stderr, flush=True)
    report = {
        "command": " ".join(["python -m bench.reaction_share", *sys.argv[1:]]),
        "cpu": cpu(),
        "bundle": served.bundle.name,
        "served_index": version,
        "share": SHARE,
        "rows": rows,
    }
    lines = [
        f"`{report['command']}` on {report['cpu']['model']}, bundle {report['bundle']}: the share of turns "
        f"answered with a reaction (the setting: {SHARE:.0%}), turns replayed in a fixed random order.",
        "",
        "| set | candidates | starts from | threshold | that threshold alone | first 50 | first 100 | first 300 "
        "| all | turns |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        shares = " | ".join(f"{r[f'first_{n}']:.1%}" if f"first_{n}" in r else "" for n in PREFIXES)
        lines.append(
            f"| {r['set']} | {r['candidates']} | {r['start']} | {r['fallback']} | {r['fallback_alone']:.1%} "
            f"| {shares} | **{r['all']:.1%}** "
            f"| {r['turns']} |"
        )
    reports.write(args.out, report, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
