"""1-of-100 response selection on held-out test conversations, and encoder latency.

    python -m models.evaluate            # every bundle + TF-IDF -> reports/eval.{md,json}

For each example the true next turn competes with 99 replies drawn from the
other examples (fixed seed, never a reply equal to the true one once
normalised). Ranks are strict: a negative must score higher to push the true
reply down, and a tie does not.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from app.config import Settings
from app.engine.bundle import MANIFEST, list_bundles, read_manifest
from app.engine.encoder import Encoder
from app.engine.reactions import ReactionClassifier
from app.engine.reranker import PolyReranker
from app.engine.runtime import NotReady, load_serving
from app.engine.text import normalize
from index.store import IndexStore
from models.data import Split, load_conversations, load_pairs
from models.poly import reranked_ranks
from models.reactions import ReactionSet
from models.walk import SOURCES, replay, sources, utility

CANDIDATES = 100
LATENCY_QUERIES = 200
LATENCY_BATCH = 64
FALLBACK_SHARES = (0.05, 0.1, 0.2, 0.3)  # shares of turns a lower reply-matching threshold would send to reactions


@dataclass
class EvalSet:
    contexts: list[list[str]]  # [N] turns, oldest first
    replies: list[str]  # [N]
    negatives: np.ndarray  # [N, 99] rows of `replies`

    def joined(self, separator: str, turns: int) -> list[str]:
        return [separator.join(c[-turns:]) for c in self.contexts]


def eval_set(n: int = 2000, seed: int = 0, split: Split = "test", path: Path | None = None) -> EvalSet:
    pairs = load_pairs(split, max_context_turns=3, path=path)
    rng = np.random.default_rng(seed)
    chosen = [pairs[i] for i in rng.choice(len(pairs), size=min(n, len(pairs)), replace=False)]
    if len(chosen) < CANDIDATES:
        raise ValueError(f"1-of-{CANDIDATES} needs at least {CANDIDATES} {split} examples, got {len(chosen)}")
    replies = [p.reply for p in chosen]
    keys = [normalize(r) for r in replies]
    negatives = np.empty((len(chosen), CANDIDATES - 1), dtype=np.int64)  # [N, 99]
    for i in range(len(chosen)):
        pool = rng.permutation(len(chosen))
        picked = [j for j in pool if j != i and keys[j] != keys[i]][: CANDIDATES - 1]
        negatives[i] = picked
    return EvalSet([list(p.context) for p in chosen], replies, negatives)


def ranks(context: np.ndarray, reply: np.ndarray, negatives: np.ndarray) -> np.ndarray:
    """context, reply: [N, D] unit rows; negatives [N, 99]. Returns the true reply's rank, 1-based, [N]."""
    positive = (context * reply).sum(axis=1)  # [N]
    negative = np.einsum("nd,nkd->nk", context, reply[negatives])  # [N, 99]
    return 1 + (negative > positive[:, None]).sum(axis=1)


def metrics(rank: np.ndarray) -> dict[str, float]:
    return {
        "r_at_1": round(float((rank == 1).mean()), 4),
        "r_at_10": round(float((rank <= 10).mean()), 4),
        "mrr": round(float((1.0 / rank).mean()), 4),
    }


def tfidf_metrics(data: EvalSet, path: Path | None = None) -> dict[str, float]:
    """TF-IDF on the last turn only, fitted on train turns: the lexical baseline."""
    from sklearn.feature_extraction.text import TfidfVectorizer

    train_turns = [t for c in load_conversations(path) for t in c.turns][:200_000]
    vectorizer = TfidfVectorizer(sublinear_tf=True).fit(train_turns)
    context = vectorizer.transform([c[-1] for c in data.contexts])  # [N, V] sparse, unit rows
    reply = vectorizer.transform(data.replies)  # [N, V]
    positive = np.asarray(context.multiply(reply).sum(axis=1)).ravel()  # [N]
    rank = np.ones(len(data.replies), dtype=np.int64)
    for i in range(len(data.replies)):
        scores = (reply[data.negatives[i]] @ context[i].T).toarray().ravel()  # [99]
        rank[i] += int((scores > positive[i]).sum())
    return metrics(rank)


def bundle_ranks(encoder: Encoder, data: EvalSet, rerank_depth: int = 50) -> tuple[np.ndarray, np.ndarray | None]:
    """[N] rank of the true reply by the bi-encoder, and after the poly rerank of its top `rerank_depth`."""
    m = encoder.manifest
    joined = data.joined(m.turn_separator, m.max_context_turns)
    reply = encoder.encode(data.replies, side="reply")  # [N, D]
    if m.poly is None:
        return ranks(encoder.encode(joined, side="context"), reply, data.negatives), None
    context, poly = encoder.encode_with_poly(joined)  # [N, D], [N, m, D]
    candidates = np.concatenate([np.arange(len(joined))[:, None], data.negatives], axis=1)  # [N, 100], true first
    bi = np.einsum("nd,ncd->nc", context, reply[candidates])  # [N, 100]
    reranker = PolyReranker(m.poly)
    final = np.stack([reranker.rescore(poly[i], bi[i], reply[candidates[i]]) for i in range(len(joined))])
    return ranks(context, reply, data.negatives), reranked_ranks(bi, final, rerank_depth)


def bundle_metrics(encoder: Encoder, data: EvalSet) -> dict[str, float]:
    """R@1, R@10, MRR; with a poly head also R@1 after the rerank."""
    bi, reranked = bundle_ranks(encoder, data)
    figures = metrics(bi)
    if reranked is not None:
        figures["rerank_r_at_1"] = round(float((reranked == 1).mean()), 4)
    return figures


def reaction_metrics(bundle_dir: Path, encoder: Encoder, path: Path | None = None) -> dict[str, float]:
    """Accuracy@1 and @5 on every test turn whose true reply is one of the bundle's reactions."""
    m = encoder.manifest
    if m.reactions is None:
        return {}
    classifier = ReactionClassifier.load(bundle_dir, m.reactions)
    pairs = load_pairs("test", m.max_context_turns, path)
    labels = ReactionSet.from_labels(m.reactions.labels).classify([p.reply for p in pairs])  # [N]
    contexts = [m.turn_separator.join(p.context) for p, label in zip(pairs, labels, strict=True) if label >= 0]
    if not contexts:
        return {}
    probs = classifier.probabilities(encoder.encode(contexts, side="context"))  # [M, C]
    truth = labels[labels >= 0]  # [M]
    rank = 1 + (probs > probs[np.arange(len(truth)), truth][:, None]).sum(axis=1)  # [M]
    return {
        "reaction_acc_at_1": round(float((rank == 1).mean()), 4),
        "reaction_acc_at_5": round(float((rank <= 5).mean()), 4),
        "reaction_examples": len(truth),
        "reaction_share_of_test_replies": round(len(truth) / len(pairs), 4),
    }


def latency(encoder: Encoder, data: EvalSet) -> dict[str, float]:
    """Context encoding only: p50 of single queries, and ms per text in batches of 64."""
    m = encoder.manifest
    texts = data.joined(m.turn_separator, m.max_context_turns)
    for text in texts[:20]:
        encoder.encode([text], side="context")
    single = []
    for text in texts[:LATENCY_QUERIES]:
        started = time.perf_counter()
        encoder.encode([text], side="context")
        single.append((time.perf_counter() - started) * 1000)
    batch = texts[: LATENCY_BATCH * 8]
    started = time.perf_counter()
    for i in range(0, len(batch), LATENCY_BATCH):
        encoder.encode(batch[i : i + LATENCY_BATCH], side="context")
    per_text = (time.perf_counter() - started) * 1000 / len(batch)
    return {"single_p50_ms": round(float(np.median(single)), 2), "batched_ms_per_text": round(per_text, 2)}


def source_report(artifacts: Path, judge_dir: Path, data: EvalSet) -> dict[str, Any] | None:
    """Which source answers each test turn under the served bundle's thresholds, and how well.

    Per source: its share of turns; the judge cosine of its answers to the
    true replies, and the share of them off topic (`models/walk.py`); the
    1-of-100 R@1 of reply matching on those same turns,
    which says how reliable retrieval was there; and, for reactions, the
    accuracy on the turns whose true reply is one of the reactions."""
    settings = Settings(artifacts_dir=artifacts)
    try:
        serving = load_serving(settings, IndexStore(settings.indexes_root))
    except (NotReady, FileNotFoundError, ValueError) as error:
        print(f"[eval] no per-source figures: {error}")
        return None
    features = replay(serving, Encoder(judge_dir, read_manifest(judge_dir)), data.contexts, data.replies)
    chosen = sources(features, serving.bundle.thresholds)  # [N]
    bi, reranked = bundle_ranks(serving.encoder, data, settings.rerank_depth)
    hit = (reranked if reranked is not None else bi) == 1  # [N] what reply matching gets right, 1-of-100
    labels = serving.reactions.labels if serving.reactions is not None else []
    truth = ReactionSet.from_labels(labels).classify(data.replies)  # [N], -1: not a reaction
    predicted = np.array([labels.index(a) if a in labels else -2 for a in features.answers["reaction"]])
    off_topic = {s: features.judged[s] < features.off_topic_below for s in SOURCES}  # [N] each
    per_source = []
    for source in SOURCES:
        turns = chosen == source
        is_reaction = turns & (truth >= 0)
        per_source.append(
            {
                "source": source,
                "share": round(float(turns.mean()), 4),
                "judge_cosine": round(float(features.judged[source][turns].mean()), 4) if turns.any() else None,
                "off_topic": round(float(off_topic[source][turns].mean()), 4) if turns.any() else None,
                "reply_matching_off_topic": round(float(off_topic["reply_matching"][turns].mean()), 4)
                if turns.any()
                else None,
                "reply_matching_r_at_1": round(float(hit[turns].mean()), 4) if turns.any() else None,
                "true_reply_is_reaction": round(float(is_reaction.sum() / max(1, turns.sum())), 4),
                "reaction_acc_at_1": round(float((predicted == truth)[is_reaction].mean()), 4)
                if is_reaction.any()
                else None,
            }
        )
    # Does the reply-matching score find the turns where retrieval is least
    # reliable? Send its lowest-scored share of turns to reactions and
    # compare reply matching's R@1 on those turns with the rest.
    fallback = []
    for share in FALLBACK_SHARES:
        low = features.reply_score < np.quantile(features.reply_score, share)  # [N]
        fallback.append(
            {
                "share": share,
                "reply_matching_r_at_1_on_fallback_turns": round(float(hit[low].mean()), 4),
                "reply_matching_r_at_1_on_the_rest": round(float(hit[~low].mean()), 4),
            }
        )
    return {
        "bundle": serving.bundle.name,
        "thresholds": asdict(serving.bundle.thresholds),
        "fallback_curve": fallback,
        "judge": read_manifest(judge_dir).name,
        "walk_judge_cosine": round(float(utility(features, chosen).mean()), 4),
        "off_topic_below": round(features.off_topic_below, 4),
        "walk_off_topic": round(
            float(sum(((chosen == s) & off_topic[s]).mean() for s in ("query_similarity", "reply_matching"))), 4
        ),
        "reply_matching_only_off_topic": round(float(off_topic["reply_matching"].mean()), 4),
        "reply_matching_only_judge_cosine": round(float(features.judged["reply_matching"].mean()), 4),
        "per_source": per_source,
    }


def record(bundle_dir: Path, figures: dict[str, float]) -> None:
    """The figures a bundle is released with live in its manifest; files and checksum are unchanged."""
    path = bundle_dir / MANIFEST
    manifest = json.loads(path.read_text())
    manifest["eval"] = figures
    path.write_text(json.dumps(manifest, indent=2) + "\n")


def _cell(value: object, fmt: str = "{:.3f}") -> str:
    return "–" if value is None else fmt.format(value)


def markdown(rows: list[dict[str, Any]], n: int, walk: dict[str, Any] | None) -> str:
    lines = [
        f"1-of-{CANDIDATES} response selection on {n} held-out test-split examples (3-turn contexts), "
        f'encoder latency for the context on this machine. "+ poly": the bi-encoder\'s top 50 reranked '
        "by the bundle's poly head.",
        "",
        "| model | layers | quantization | R@1 | R@1 + poly | R@10 | MRR | single query p50 | batched (64) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r.get('layers', '–')} | {r.get('quantization', '–')} | {r['r_at_1']:.3f} | "
            f"{_cell(r.get('rerank_r_at_1'))} | {r['r_at_10']:.3f} | {r['mrr']:.3f} | "
            f"{_cell(r.get('single_p50_ms'), '{:.2f} ms')} | {_cell(r.get('batched_ms_per_text'), '{:.2f} ms/text')} |"
        )
    reacting = [r for r in rows if "reaction_acc_at_1" in r]
    if reacting:
        lines += [
            "",
            "Reactions: accuracy on every test turn whose true reply is one of the bundle's reaction classes.",
            "",
            "| model | accuracy@1 | accuracy@5 | test turns | share of test replies |",
            "|---|---|---|---|---|",
        ]
        for r in reacting:
            lines.append(
                f"| {r['model']} | {r['reaction_acc_at_1']:.3f} | {r['reaction_acc_at_5']:.3f} | "
                f"{r['reaction_examples']} | {r['reaction_share_of_test_replies']:.3f} |"
            )
    if walk:
        t = walk["thresholds"]
        lines += [
            "",
            f"Which source answers, on the same {n} test turns, for the served bundle {walk['bundle']} with its "
            f"calibrated thresholds (query similarity ≥ {t['query_similarity']}, reply matching ≥ "
            f"{t['reply_matching']}). Judge: cosine between the answer and the true reply under "
            f"{walk['judge']}; the walk averages {walk['walk_judge_cosine']:.3f}, reply matching alone "
            f'{walk["reply_matching_only_judge_cosine"]:.3f}. "Off topic": judge cosine below '
            f"{walk['off_topic_below']:.3f}, no closer than another turn's answer usually is; the walk serves "
            f"an off-topic retrieved answer on {walk['walk_off_topic']:.3f} of turns, reply matching alone would "
            f'on {walk["reply_matching_only_off_topic"]:.3f}. "Reply matching there": how reply matching would '
            "have done on the turns each source took (off-topic share, 1-of-100 R@1): where it was reliable.",
            "",
            "| source | share of turns | judge cosine | off topic | reply matching there: off topic | R@1 "
            "| true reply is a reaction | reaction accuracy@1 there |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for p in walk["per_source"]:
            lines.append(
                f"| {p['source']} | {p['share']:.3f} | {_cell(p['judge_cosine'])} | {_cell(p['off_topic'])} | "
                f"{_cell(p['reply_matching_off_topic'])} | "
                f"{_cell(p['reply_matching_r_at_1'])} | {p['true_reply_is_reaction']:.3f} | "
                f"{_cell(p['reaction_acc_at_1'])} |"
            )
        lines += [
            "",
            "If a lower `reply_matching` threshold sent the lowest-scored share of turns to reactions, reply "
            "matching's 1-of-100 R@1 on those turns and on the rest:",
            "",
            "| share sent to reactions | R@1 on those turns | R@1 on the rest |",
            "|---|---|---|",
        ]
        for c in walk["fallback_curve"]:
            lines.append(
                f"| {c['share']:.2f} | {c['reply_matching_r_at_1_on_fallback_turns']:.3f} | "
                f"{c['reply_matching_r_at_1_on_the_rest']:.3f} |"
            )
    return "\n".join(lines) + "\n"


def evaluate_all(
    bundles_root: Path, out: Path, n: int, seed: int, path: Path | None = None, judge: Path | None = None
) -> list[dict[str, Any]]:
    data = eval_set(n, seed, path=path)
    rows: list[dict[str, Any]] = [{"model": "TF-IDF, last turn", **tfidf_metrics(data, path)}]
    for bundle_dir, manifest in list_bundles(bundles_root):
        started = time.perf_counter()
        encoder = Encoder(bundle_dir, manifest)
        figures = {
            **bundle_metrics(encoder, data),
            **reaction_metrics(bundle_dir, encoder, path),
            **latency(encoder, data),
            "examples": len(data.replies),
        }
        record(bundle_dir, figures)
        rows.append(
            {
                "model": manifest.name,
                "layers": manifest.num_layers,
                "quantization": "int8" if manifest.quantization.startswith("int8") else "fp32",
                **figures,
            }
        )
        print(f"[eval] {manifest.name}: {figures} ({time.perf_counter() - started:.0f}s)")
    walk = source_report(bundles_root.parent, judge, data) if judge is not None and judge.is_dir() else None
    out.mkdir(parents=True, exist_ok=True)
    report = {"examples": len(data.replies), "seed": seed, "rows": rows, "sources": walk}
    (out / "eval.json").write_text(json.dumps(report, indent=2))
    (out / "eval.md").write_text(markdown(rows, len(data.replies), walk))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bundles", type=Path, default=Path("artifacts/bundles"))
    parser.add_argument("--out", type=Path, default=Path("reports"))
    parser.add_argument("--examples", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--judge", type=Path, default=Path("artifacts/bundles/minilm-l6-zeroshot-int8"))
    args = parser.parse_args()
    evaluate_all(args.bundles, args.out, args.examples, args.seed, judge=args.judge)
    print((args.out / "eval.md").read_text())


if __name__ == "__main__":
    main()
