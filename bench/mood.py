"""Never cheer bad news, through the live API: each bad-news line of the labelled set after two cheerful
turns, each good-news line after two sad ones, and the served answers.

    python -m bench.mood [--reactions DIR ...] [--artifacts artifacts]   # make bench-mood

For each reaction model named (default: the release's), a service on the full index under
`--artifacts` (`make index`), answering `/reply` with default options. Each answer is judged by
its side: a reaction by the side its class takes (models/reactions/classes.py), a stored reply by
the last reaction model's valence model at its reply margin (the guard's own reader, so this
counts what the guard let through; the report lists every answer for a person to read). Also
the issue's session, turn by turn, and p50 of /reply over held-out contexts at 1 client.
Writes reports/mood.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import httpx

from bench.reports import write
from bench.service import ROOT, cpu_description, free_port, start_server, test_contexts, wait_ready
from core.bundle import RELEASE_REACTIONS, open_bundle
from core.store import IndexStore
from core.valence import Valence
from models.reactions.classes import REACTION_CLASSES

LABELLED = ROOT / "bench" / "data" / "reactions_labelled.jsonl"
# Two turns of one mood before the line of the other (user, bot), in each language.
BEFORE = {
    ("en", "cheerful"): ["I went hiking with my dog, it was great", "that sounds like so much fun!"],
    ("en", "sad"): ["this week has been awful", "oh no, I'm sorry to hear that"],
    ("ko", "cheerful"): ["주말에 강아지랑 등산 갔는데 너무 좋았어", "우와 완전 재밌었겠다!"],
    ("ko", "sad"): ["이번 주 너무 힘들었어", "헐 어떡해 ㅠㅠ"],
}
SESSION = ["hi! how was your weekend?", "I went hiking with my dog, it was great", "do you like hiking?"]
FIRED = ["오늘 회사에서 잘렸어", "I got fired today"]
SIDE_OF_CLASS = {c.name: {"valence+": 1, "valence-": -1}.get(c.stance, 0) for c in REACTION_CLASSES}
LATENCY_CONTEXTS = 200


def side_of_answer(answer: dict[str, Any], valence: Valence) -> int:
    """+1 cheerful, -1 sympathetic, 0 neither: a reaction by its class, a reply by the valence model."""
    if answer["source"] == "reaction" and answer["id"].startswith("reaction:"):
        return SIDE_OF_CLASS[REACTION_CLASSES[int(answer["id"].split(":")[1])].name]
    return int(valence.reply_sides([answer["reply"]], valence.reply_log_odds([answer["reply"]]))[0])


def lines() -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in LABELLED.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [r for r in rows if r["category"] in ("bad_news", "good_news", "achievement")]


def run(reactions: Path, artifacts: Path, judge: Valence) -> dict[str, Any]:
    port = free_port()
    env = {**os.environ, "CHITCHAT_REACTIONS_DIR": str(reactions), "CHITCHAT_ARTIFACTS_DIR": str(artifacts)}
    env.pop("CHITCHAT_REDIS_URL", None)
    server = start_server(port, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(f"{base}/readyz", server, timeout_s=600)
        with httpx.Client(base_url=base, timeout=60) as client:
            replayed = []
            for row in lines():
                bad = row["category"] == "bad_news"
                before = BEFORE[(row["language"], "cheerful" if bad else "sad")]
                for context in ([row["text"]], [*before, row["text"]]):
                    answer = client.post("/reply", json={"context": context}).json()
                    served = side_of_answer(answer, judge)
                    replayed.append(
                        {
                            "language": row["language"],
                            "half": row["half"],
                            "category": row["category"],
                            "context": context,
                            "answer": answer["reply"],
                            "strategy": answer["source"],
                            "side": served,
                            "opposite": served == (1 if bad else -1),
                        }
                    )
            session = []
            for n, fired in enumerate(FIRED):
                sid = f"mood-{n}-{time.time_ns()}"
                for turn in [*SESSION, fired]:
                    answer = client.post("/reply", json={"session_id": sid, "message": turn}).json()
                    session.append({"turn": turn, "answer": answer["reply"], "strategy": answer["source"]})
                alone = client.post("/reply", json={"context": [fired]}).json()
                session.append({"turn": f"(alone) {fired}", "answer": alone["reply"], "strategy": alone["source"]})
            contexts = test_contexts(LATENCY_CONTEXTS, 3, seed=1)
            seconds = []
            for context in contexts:
                started = time.perf_counter()
                client.post("/reply", json={"context": context}).raise_for_status()
                seconds.append(time.perf_counter() - started)
            info = client.get("/info").json()
    finally:
        server.terminate()
        server.wait(30)
    return {
        "reactions": str(reactions),
        "reaction_model": info["model"].get("reaction_model"),
        "replayed": replayed,
        "opposite": sum(r["opposite"] for r in replayed),
        "session": session,
        "p50_ms": round(1000 * statistics.median(seconds), 2),
    }


def scoring_seconds(artifacts: Path, valence: Valence) -> dict[str, float]:
    """Seconds to score every stored reply of the default set's current index, as a build does."""
    store = IndexStore(artifacts / "indexes")
    version = store.current()
    if version is None:
        raise SystemExit(f"no index under {artifacts}: run `make index`")
    texts = store.tables(version).reply_texts
    started = time.perf_counter()
    valence.reply_sides(texts, valence.reply_log_odds(texts))
    seconds = time.perf_counter() - started
    return {"replies": len(texts), "seconds": round(seconds, 2), "us_per_reply": round(1e6 * seconds / len(texts), 1)}


def markdown(runs: list[dict[str, Any]], command: str, machine: str) -> str:
    out = [
        f"`{command}` on {machine}. Each bad-news line of bench/data/reactions_labelled.jsonl alone and after "
        "two cheerful turns, each good-news line alone and after two sad ones, through `/reply`. An answer of the "
        "opposite clear side: a reaction by its class, a stored reply by the valence model's reply head at its "
        "margin (the guard's own reader).",
        "",
        "| reactions | answers | opposite side | of them after the other mood | /reply p50, 1 client |",
        "|---|---|---|---|---|",
    ]
    for r in runs:
        after = sum(x["opposite"] for x in r["replayed"] if len(x["context"]) > 1)
        out.append(f"| {r['reactions']} | {len(r['replayed'])} | {r['opposite']} | {after} | {r['p50_ms']} ms |")
    for r in runs:
        out += ["", f"**{r['reactions']}**: the session, turn by turn", ""]
        out += [f"- {s['turn']} → {s['answer']} ({s['strategy']})" for s in r["session"]]
        out += ["", "Opposite answers:", ""]
        out += [
            f"- ({x['language']}, {x['half']}) {' / '.join(x['context'])} → {x['answer']} ({x['strategy']})"
            for x in r["replayed"]
            if x["opposite"]
        ] or ["- none"]
    return "\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reactions", type=Path, action="append", help="a reaction model (repeatable)")
    parser.add_argument("--artifacts", type=Path, default=ROOT / "artifacts")
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "mood")
    parser.add_argument("--scoring-only", action="store_true", help="only time scoring the stored replies")
    args = parser.parse_args()
    models = args.reactions or [RELEASE_REACTIONS]
    judge_dir = models[-1]
    spec = open_bundle(judge_dir).valence
    if spec is None:
        raise SystemExit(f"{judge_dir} has no valence model to judge the replies with")
    judge = Valence.load(judge_dir, spec)
    scoring = scoring_seconds(args.artifacts, judge)
    print(f"[mood] scored {scoring['replies']} stored replies in {scoring['seconds']} s on {cpu_description()}")
    if args.scoring_only:
        return
    runs = [run(m, args.artifacts, judge) for m in models]
    machine = cpu_description()
    command = "python -m bench.mood " + " ".join(f"--reactions {m}" for m in models)
    text = markdown(runs, command, machine) + (
        f"\nScoring the {scoring['replies']} stored replies' valence, as a build does: {scoring['seconds']} s "
        f"({scoring['us_per_reply']} µs a reply).\n"
    )
    write(args.out, {"command": command, "cpu": machine, "scoring": scoring, "runs": runs}, text)


if __name__ == "__main__":
    main()
