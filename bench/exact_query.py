"""Query similarity with and without the last turn's vector, where no stored query equals that turn.

    python -m bench.exact_query [--contexts 3000]

At the bundle's threshold (the stored queries' own p99 neighbour cosine)
query similarity answers only on a near copy of a stored query. With
`Settings.query_similarity_exact_only` the service encodes the last turn only
when a stored query equals it once normalised, and otherwise walks without
query similarity. This replays held-out contexts (as `make bench-load` sends
them) through the walk both ways, in process, and counts the answers that
differ (the reply, its source, or any candidate id), and the tokens of the
last turn a request no longer encodes. Writes reports/exact_query.{md,json}.
"""

from __future__ import annotations

import sys

from bench import reports
from bench.narrow_search import encoded_contexts, release_serving, replay_arguments, walks
from core.machine import cpu
from core.text import normalize


def main() -> None:
    args = replay_arguments(__doc__.split("\n\n")[0], "exact_query")
    serving, version = release_serving(args.artifacts)
    encoder = serving.encoder
    turns, last, joined = encoded_contexts(encoder, args.contexts, serving.index.manifest.query_side)
    joined_texts = [encoder.join_context(t) for t in turns]

    exact = [normalize(t[-1]) in serving.index.query_rows_by_text for t in turns]
    gated_last = [vector if is_exact else None for vector, is_exact in zip(last, exact, strict=True)]
    before, gated = walks(serving, turns, last, joined)[0], walks(serving, turns, gated_last, joined)[0]
    differ = sum(a != b for a, b in zip(before, gated, strict=True))
    tokens = [len(encoder.tokenize([t[-1]], serving.index.manifest.query_side)[0]) for t in turns]
    context_tokens = [len(encoder.tokenize([j], "context")[0]) for j in joined_texts]
    skipped = sum(n for n, e in zip(tokens, exact, strict=True) if not e)
    report = {
        "command": " ".join(["python -m bench.exact_query", *sys.argv[1:]]),
        "cpu": cpu(),
        "index": f"{version} ({serving.index.manifest.replies} replies, {serving.index.manifest.queries} queries)",
        "query_threshold": serving.thresholds.query_similarity,
        "contexts": len(turns),
        "last_turn_is_a_stored_query": sum(exact),
        "query_similarity_answers": sum(a[1] == "query_similarity" for a in before),
        "differing_answers": differ,
        # Of everything a request encodes without the gate (last turn + context), the share it no longer does.
        "tokens_not_encoded_share": round(skipped / (sum(tokens) + sum(context_tokens)), 3),
    }
    lines = [
        f"`{report['command']}` on {report['cpu']['model']}, index {report['index']}, "
        f"query threshold {report['query_threshold']}.",
        "",
        f"- contexts: {len(turns)}; the last turn equals a stored query (normalised) in "
        f"{report['last_turn_is_a_stored_query']}; query similarity answers {report['query_similarity_answers']}",
        f"- answers that differ when only those last turns are encoded (reply, source or any candidate id): "
        f"**{differ}**",
        f"- share of the tokens a request encoded that it no longer does: {report['tokens_not_encoded_share']}",
    ]
    reports.write(args.out, report, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
