"""The full index build, timed, and before and after a change in one sitting.

    python -m bench.index_build --before COMMIT    # that commit's build, then this tree's, one after the other
    python -m bench.index_build                    # this tree's build alone

Each build is `python -m index --no-reuse` into a temporary artifacts folder of its own, so
nothing is reused and every text is encoded. Reported per build: wall seconds, the encode
phase (from its progress bar) and the rest (ANN builds, checks, writing), the texts and
encoder passes, and the CPU with its VNNI flag. With --before, the two indexes are compared:
whether the reply index holds the same vectors, each index's recall@10 against exact
search, and what query similarity answers on held-out chitchat test contexts with each
index's stored queries (the last turn encoded as that index's manifest says), in two fixed
halves. Writes reports/index_build.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from bench.reports import write
from bench.service import cpu_description
from core import ann
from core.bundle import RELEASE_BUNDLE, open_bundle
from core.encoder import Encoder
from core.store import IndexStore
from core.text import normalize
from index.corpus import load_pairs

ROOT = Path(__file__).resolve().parents[1]
CONTEXTS = 2000  # held-out test contexts for the query-similarity comparison, in two halves
ENCODE_BAR = re.compile(r"encode: 100%\|[^|]*\| (\d+)/\d+ \[(?:(\d+):)?(\d+):(\d+)")


def seconds_of(bar: re.Match[str]) -> int:
    hours, minutes, secs = (int(x) if x else 0 for x in bar.groups()[1:])
    return 3600 * hours + 60 * minutes + secs


def build(tree: Path, artifacts: Path, corpus: Path | None) -> dict[str, Any]:
    """Runs `python -m index --no-reuse` in `tree`, with this interpreter, into `artifacts`."""
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "index", "--no-reuse", "--artifacts", str(artifacts)]
        + (["--corpus", str(corpus.resolve())] if corpus else []),
        cwd=tree,
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - started
    if done.returncode:
        raise RuntimeError(f"the build in {tree} failed:\n{done.stderr[-3000:]}")
    bars = list(ENCODE_BAR.finditer(done.stderr.replace("\r", "\n")))
    encode_s = seconds_of(bars[-1]) if bars else None
    (version,) = [p.name for p in (artifacts / "indexes").iterdir() if p.name.startswith("v")]
    manifest = json.loads((artifacts / "indexes" / version / "manifest.json").read_text())
    bundle = open_bundle(RELEASE_BUNDLE)
    # A version from before `query_side` encoded each text as a context too, a second pass where the
    # bundle's sides read differently (e5's prefixes). Either build also encodes a few hundred sampled
    # texts as contexts for its checks.
    two_sides = manifest.get("query_side", "context") == "context" and bundle.query_prefix != bundle.passage_prefix
    return {
        "wall_s": round(wall, 1),
        "encode_s": encode_s,
        "rest_s": round(wall - encode_s, 1) if encode_s is not None else None,
        "texts_encoded": manifest["encoded"],
        "encoder_passes": manifest["encoded"] * (2 if two_sides else 1),
        "version": version,
        "query_side": manifest.get("query_side", "context"),
        "ann": manifest["ann"],
        "stage_seconds": manifest.get("stage_seconds", {}),  # from the build's own clock; older builds lack it
    }


def compare(before: Path, after: Path) -> dict[str, Any]:
    """The two indexes side by side: reply vectors, and query similarity on held-out contexts."""
    bundle = open_bundle(RELEASE_BUNDLE)
    encoder = Encoder(RELEASE_BUNDLE, bundle)
    versions = {}
    for name, root in (("before", before), ("after", after)):
        store = IndexStore(root / "indexes")
        (version,) = store.versions()
        versions[name] = store.load(version)
    replies = {name: ann.vectors_of(v.reply_index) for name, v in versions.items()}  # [R, D] each
    pairs = load_pairs("test", bundle.max_context_turns)
    chosen = random.Random(0).sample(pairs, min(CONTEXTS, len(pairs)))
    last = [p.context[-1][:1000] for p in chosen]
    truth = [normalize(p.reply) for p in chosen]
    joined = encoder.encode([bundle.turn_separator.join(p.context) for p in chosen], "context")  # [N, D]
    top: dict[str, list[str]] = {}
    figures: dict[str, Any] = {}
    for name, version in versions.items():
        # The reply graph at the efSearch its build chose, on contexts as the service sends them.
        _, truth_rows = faiss.knn(joined, replies[name], 10, metric=faiss.METRIC_INNER_PRODUCT)  # [N, 10]
        reply_recall = ann.recall_at_k(version.reply_index, joined, truth_rows)
        side = version.manifest.query_side
        vectors = encoder.encode(last, side)  # [N, D]
        scores, rows = version.query_index.search(np.ascontiguousarray(vectors), 1)  # [N, 1] each
        answered = [int(version.query_reply_rows[r]) for r in rows[:, 0]]
        top[name] = [normalize(version.reply_texts[r]) for r in answered]
        hits = np.array([a == t for a, t in zip(top[name], truth, strict=True)])  # [N]
        half = len(hits) // 2
        figures[name] = {
            "reply_ef_search": version.manifest.ann["replies"].get("ef_search"),
            "reply_recall_at_10_held_out": round(reply_recall, 4),
            "query_side": side,
            "r_at_1_half_a": round(float(hits[:half].mean()), 4),
            "r_at_1_half_b": round(float(hits[half:].mean()), 4),
            "top_score_p50": round(float(np.median(scores[:, 0])), 4),
        }
    same = np.mean([a == b for a, b in zip(top["before"], top["after"], strict=True)])
    return {
        "reply_vectors_identical": bool(np.array_equal(replies["before"], replies["after"])),
        "reply_vectors_max_abs_diff": float(np.abs(replies["before"] - replies["after"]).max())
        if replies["before"].shape == replies["after"].shape
        else None,
        "query_similarity": figures,
        "query_similarity_same_top_reply": round(float(same), 4),
        "contexts": len(chosen),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", help="a git commit to build first, in a worktree, for the comparison")
    parser.add_argument("--corpus", type=Path, help="a smaller chitchat-format corpus: a dry run of the script")
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "index_build")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="chitchat-index-build-"))
    report: dict[str, Any] = {"command": " ".join(["python -m bench.index_build", *sys.argv[1:]])}
    report["cpu"] = cpu_description()
    try:
        if args.before:
            tree = work / "before-tree"
            subprocess.run(["git", "worktree", "add", "--detach", str(tree), args.before], cwd=ROOT, check=True)
            try:
                report["before"] = {"commit": args.before, **build(tree, work / "before", args.corpus)}
            finally:
                subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=False)
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True)
        commit = head.stdout.strip() + (" + changes" if dirty.stdout.strip() else "")
        report["after"] = {"commit": commit, **build(ROOT, work / "after", args.corpus)}
        if args.before:
            report["speedup"] = round(report["before"]["wall_s"] / report["after"]["wall_s"], 2)
            report["comparison"] = compare(work / "before", work / "after")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    write(args.out, report, markdown(report))


def markdown(report: dict[str, Any]) -> str:
    lines = [
        "# The full index build",
        "",
        f"`{report['command']}` on {report['cpu']}, the release bundle, the chitchat train candidates.",
        "",
        "| build | wall s | encode s | rest s | texts encoded | passes | reply index | query index | stages s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name in ("before", "after"):
        if name in report:
            b = report[name]
            stages = ", ".join(f"{k} {v:.1f}" for k, v in b.get("stage_seconds", {}).items()) or "–"
            lines.append(
                f"| {name} ({b['commit']}) | {b['wall_s']} | {b['encode_s']} | {b['rest_s']} | "
                f"{b['texts_encoded']:,} | {b['encoder_passes']:,} | {b['ann']['replies']['kind']} | "
                f"{b['ann']['queries']['kind']} | {stages} |"
            )
    if "speedup" in report:
        c = report["comparison"]
        lines += ["", f"**{report['speedup']}×** the speed of the build before.", ""]
        lines.append(
            f"Reply vectors identical: {c['reply_vectors_identical']} (max abs diff {c['reply_vectors_max_abs_diff']})."
        )
        lines += [
            "",
            "Reply graph: its efSearch and recall@10 against exact search on held-out joined contexts. Query "
            "similarity: the top stored query's reply against the true reply, held-out test contexts:",
            "",
            "| index | efSearch | reply recall@10 | last turn encoded as | R@1 half A | R@1 half B | top score p50 |",
            "|---|---|---|---|---|---|---|",
        ]
        for name, f in c["query_similarity"].items():
            lines.append(
                f"| {name} | {f['reply_ef_search']} | {f['reply_recall_at_10_held_out']} | {f['query_side']} | "
                f"{f['r_at_1_half_a']} | {f['r_at_1_half_b']} | {f['top_score_p50']} |"
            )
        lines.append(f"\nThe same top reply in {c['query_similarity_same_top_reply']:.1%} of {c['contexts']} contexts.")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
