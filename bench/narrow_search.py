"""Query similarity's narrow probe against its full search: the same answers, for how much less search.

    python -m bench.narrow_search [--contexts 3000]

Query similarity answers only on a near copy of a stored query (cosine at
the bundle's threshold, ~0.998), so `retriever.walk` first asks the query
index with the fewest probes (`ann.narrow_search`) and searches it in full
only when that finds one. This replays held-out contexts (as `make
bench-load` sends them) through the walk twice, in process: with the probe
as wide as the full search (the walk before) and as served. It reports how
many answers differ (the reply, its source, or any candidate id), and each
way's milliseconds a walk and a query search. Writes
reports/narrow_search.{md,json}.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from bench import reports
from bench.load import ROOT, contexts
from core import ann, retriever
from core.bundle import RELEASE_BUNDLE, open_bundle
from core.encoder import Encoder, Side
from core.laps import Laps
from core.machine import cpu
from core.retriever import Avoid, Serving, WalkRequest
from core.store import IndexStore

WIDE = 1 << 30  # a probe this wide is the full search: min() with the index's own parameters


Answers = list[tuple[Any, ...]]


def release_serving(artifacts: Path) -> tuple[Serving, str]:
    """The release bundle on its latest index under `artifacts`, in process, and that index version."""
    bundle = open_bundle(RELEASE_BUNDLE)
    store = IndexStore(artifacts / "indexes")
    version = store.latest_for(bundle.checksum)
    if version is None:
        raise SystemExit("no index for the release bundle: run `make index` first")
    encoder = Encoder(RELEASE_BUNDLE, bundle)
    return Serving(bundle, RELEASE_BUNDLE, encoder, store.load(version), bundle.thresholds), version


def replay_arguments(description: str, report: str) -> argparse.Namespace:
    """The options both in-process replays take: how many held-out contexts, where the index is, the report."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--contexts", type=int, default=3000)
    parser.add_argument("--artifacts", type=Path, default=ROOT / "artifacts")
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / report)
    return parser.parse_args()


def encoded_contexts(encoder: Encoder, count: int, query_side: Side) -> tuple[list[list[str]], Any, Any]:
    """The first `count` held-out contexts (as `make bench-load` sends them), and their
    last turns' (on the index's query side) and joined contexts' vectors: [N, D] each."""
    turns = contexts()[:count]
    last = encoder.encode([t[-1] for t in turns], query_side)  # [N, D]
    joined = encoder.encode([encoder.join_context(t) for t in turns], "context")  # [N, D]
    return turns, last, joined


def walks(serving: Serving, turns: list[list[str]], last: Any, joined: Any) -> tuple[Answers, float, float]:
    """(each walk's answer, ms a walk, ms of query search a walk). last, joined: [N, D] each;
    a row of `last` may be None (no query vector: query similarity sits the walk out)."""
    laps, answers = Laps(), []
    window_turns = serving.bundle.max_context_turns
    started = time.perf_counter()
    for i, context in enumerate(turns):
        window = context[-window_turns:]
        request = WalkRequest(
            window=window,
            allowed=retriever.STRATEGY_ORDER,
            k=5,
            thresholds=serving.thresholds,
            avoid=Avoid.of(window),
            query_vector=last[i],
            context_vector=joined[i],
            poly_vectors=None,
            script=retriever.conversation_script(window),
            laps=laps,
        )
        answer = retriever.walk(serving, request)
        assert answer is not None
        answers.append((answer.best.text, answer.best.source, tuple(h.id for h in answer.candidates)))
    seconds = time.perf_counter() - started
    return answers, 1000 * seconds / len(turns), 1000 * laps.seconds.get("search_queries", 0.0) / len(turns)


def main() -> None:
    args = replay_arguments(__doc__.split("\n\n")[0], "narrow_search")
    serving, version = release_serving(args.artifacts)
    turns, last, joined = encoded_contexts(serving.encoder, args.contexts, serving.index.manifest.query_side)

    narrow = (ann.NARROW_NPROBE, ann.NARROW_EF)
    runs: dict[str, list[tuple[float, float]]] = {"full": [], "narrow": []}
    answers: dict[str, Answers] = {}
    for _ in range(2):  # taking turns, so a machine that drifts slows both alike
        for way in runs:
            ann.NARROW_NPROBE, ann.NARROW_EF = (WIDE, WIDE) if way == "full" else narrow
            answers[way], walk_ms, search_ms = walks(serving, turns, last, joined)
            runs[way].append((walk_ms, search_ms))
    ann.NARROW_NPROBE, ann.NARROW_EF = narrow
    differ = sum(a != b for a, b in zip(answers["full"], answers["narrow"], strict=True))
    report = {
        "command": "python -m bench.narrow_search " + " ".join(sys.argv[1:]),
        "cpu": cpu(),
        "index": f"{version} ({serving.index.manifest.replies} replies, {serving.index.manifest.queries} queries)",
        "contexts": len(turns),
        "query_similarity_answers": sum(a[1] == "query_similarity" for a in answers["full"]),
        "differing_answers": differ,
        "narrow": {"nprobe": narrow[0], "ef_search": narrow[1]},
        "ms": {
            way: {"walk": [round(r[0], 3) for r in rs], "search_queries": [round(r[1], 3) for r in rs]}
            for way, rs in runs.items()
        },
    }
    lines = [
        f"`{report['command']}` on {report['cpu']['model']} (VNNI: {report['cpu']['vnni']}), index {report['index']}.",
        "",
        f"- contexts: {len(turns)}; query similarity answers {report['query_similarity_answers']} of them",
        f"- answers that differ (reply, source or any candidate id): **{differ}**",
        "",
        "| search of the query index | ms a walk (two runs) | ms of query search a walk |",
        "|---|---|---|",
    ]
    for way, rs in runs.items():
        lines.append(f"| {way} | {' / '.join(f'{r[0]:.2f}' for r in rs)} | {' / '.join(f'{r[1]:.2f}' for r in rs)} |")
    reports.write(args.out, report, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
