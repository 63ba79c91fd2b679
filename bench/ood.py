"""Out-of-domain figures through the live API: what releases are gated on.

    python -m bench.ood                                   # the release bundle, zero-shot MiniLM-L6, zero-shot e5
    python -m bench.ood --bundle A --bundle B --label B="release before"

For each bundle a fresh service starts with no index (its own artifacts
folder, no Redis), and for each out-of-domain set it serves (models/ood.py):

- chatterbot-corpus, English and Korean: every distinct reply of the
  language is uploaded through the admin API (`mode=replace`) as the only
  candidates; `/reply` is asked, for each distinct context, with
  `strategies=["reply_matching"]` and k = 10: R@1 and R@10 per context.
  Then once more with the default strategies: the share of turns that a
  reaction answers.
- the STS dev sets: `/similar` pair scores, 64 pairs a request, against the
  gold scores: Spearman x 100.

An English bundle is scored on the English sets only. Writes
reports/ood.json (a list: one row per bundle and set, each naming the
CPU) and reports/ood.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from scipy.stats import spearmanr

from bench.live_eval import wait
from bench.service import cpu_description, free_port
from core.bundle import RELEASE_BUNDLE, open_bundle
from models.ood import ReplySet, available_human, available_sts, chatterbot_set, human_set, sts_set
from models.reactions.classes import REACTION_CLASSES, verdict
from models.reactions.mining import near_duplicate_key, reaction_key
from models.trained_layers import saw_chatterbot

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "ood-bench"
BUNDLES = Path("artifacts/bundles")
DEFAULT_BUNDLES = (BUNDLES / "minilm-l6-zeroshot-int8", BUNDLES / "multilingual-e5-small-int8", RELEASE_BUNDLE)
MAX_PAIRS = 64  # app.schemas.MAX_PAIRS


@contextmanager
def service(bundle: Path, work: Path) -> Iterator[httpx.Client]:
    """A fresh service on `bundle` with an empty artifacts folder; yields a client with the admin token."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHITCHAT_")}
    env.update(CHITCHAT_ARTIFACTS_DIR=str(work), CHITCHAT_BUNDLE_DIR=str(bundle), CHITCHAT_ADMIN_TOKEN=TOKEN)
    command = [sys.executable, "-m", "uvicorn", "app.main:create_app", "--factory", "--port", str(port)]
    server = subprocess.Popen([*command, "--log-level", "warning"], cwd=ROOT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait(f"{url}/readyz", lambda r: r.json().get("problem") not in (None, "loading"))
        with httpx.Client(base_url=url, timeout=120, headers={"authorization": f"Bearer {TOKEN}"}) as client:
            yield client
    finally:
        server.terminate()
        server.wait(timeout=30)


def upload(client: httpx.Client, replies: list[str], language: str) -> None:
    records = [{"reply": r, "id": f"{language}-{i}"} for i, r in enumerate(replies)]
    job = client.post("/admin/candidates?mode=replace", json=records).raise_for_status().json()
    for _ in range(3000):
        state = client.get(f"/admin/jobs/{job['job_id']}").json()
        if state["state"] in ("succeeded", "failed"):
            break
        time.sleep(0.2)
    if state["state"] != "succeeded":
        raise RuntimeError(f"upload of {len(records)} {language} replies: {state}")


def reply_figures(
    client: httpx.Client, data: ReplySet, reactions: bool = True, rerank: bool | None = None
) -> dict[str, Any]:
    """R@1, R@10 (reply matching alone) overall and on each fixed half, and the reaction share
    (default strategies; `reactions=False` skips those requests), per context. `rerank`: what the
    requests ask of the poly head (None: the service's default); the figures then also hold the
    p50 ms of a request as the client saw it."""
    first = np.zeros(len(data.contexts), dtype=bool)  # [C]
    top10 = np.zeros(len(data.contexts), dtype=bool)  # [C]
    asked_back = np.zeros(len(data.contexts), dtype=bool)  # [C] the answer is a question

    seconds = np.zeros(len(data.contexts))  # [C]
    reacted = no_answer = 0
    for i, context in enumerate(data.contexts):
        body: dict[str, Any] = {"context": list(context), "k": 10, "strategies": ["reply_matching"]}
        if rerank is not None:
            body["rerank"] = rerank
        started = time.perf_counter()
        response = client.post("/reply", json=body)
        seconds[i] = time.perf_counter() - started
        if response.status_code == 404 and response.json()["error"]["kind"] == "no_candidate":
            no_answer += 1  # the service found nothing to say: a miss, counted apart
            continue
        answer = response.raise_for_status().json()
        first[i] = data.hit(i, answer["reply"])
        asked_back[i] = is_question(answer["reply"])
        top10[i] = any(data.hit(i, c["text"]) for c in answer["candidates"])
        if reactions:
            default = client.post("/reply", json={"context": list(context)}).raise_for_status().json()
            reacted += default["source"] == "reaction"
    halves = np.array(data.halves)  # [C]
    figures: dict[str, Any] = {"r_at_1": round(float(first.mean()), 4), "r_at_10": round(float(top10.mean()), 4)}
    for name in ("A", "B"):
        part = halves == name
        figures[f"half_{name.lower()}"] = {
            "r_at_1": round(float(first[part].mean()), 4),
            "r_at_10": round(float(top10[part].mean()), 4),
            "contexts": int(part.sum()),
        }
    asks = np.array([is_question(c[-1]) for c in data.contexts])  # [C] the last turn asks something
    gold_asks = np.array([any(is_question(g) for g in gold) for gold in data.gold])  # [C]
    if asks.any():
        figures["questions"] = {
            "turns_that_ask": int(asks.sum()),
            "answered_with_a_question": round(float(asked_back[asks].mean()), 4),
            "gold_is_a_question": round(float(gold_asks[asks].mean()), 4),
        }
    if reactions:
        figures["reaction_share"] = round(reacted / len(data.contexts), 4)
    if rerank is not None:
        figures["p50_ms"] = round(float(np.median(seconds)) * 1000, 2)
    if no_answer:
        figures["no_candidate"] = no_answer
    return {**figures, "contexts": len(data.contexts), "candidates": len(data.replies)}


def is_question(text: str) -> bool:
    """A turn that asks something, as the confidence model reads it: a question mark in it."""
    return "?" in text


LABELLED_REACTIONS = ROOT / "bench" / "data" / "reactions_labelled.jsonl"


def reaction_class(text: str) -> str | None:
    """The class a served reaction belongs to: by its surface in any language, or as one of a class's
    chitchat examples (so an older bundle's mined "oh no" counts as sympathy); None if no class."""
    key = near_duplicate_key(reaction_key(text))
    for cls in REACTION_CLASSES:
        surfaces = {near_duplicate_key(reaction_key(t)) for t in (*cls.surface.values(), *cls.examples)}
        if key in surfaces or text in cls.surface.values():
            return cls.name
    return None


def labelled_reactions(client: httpx.Client, language: str) -> dict[str, Any]:
    """Our labelled utterances that call for a reaction: how often the reaction served fits, and how
    many are wrong, by models/reactions/classes.py's verdicts (bench/reaction_gate.py's, on the model alone)."""
    rows = [json.loads(line) for line in LABELLED_REACTIONS.read_text(encoding="utf-8").splitlines() if line.strip()]
    rows = [r for r in rows if r["language"] == language]
    fits = wrong = unanswered = 0
    misses = []
    for row in rows:
        body = {"context": [row["text"]], "strategies": ["reaction"]}
        response = client.post("/reply", json=body)
        if response.status_code != 200:  # no reaction set speaks the language
            unanswered += 1
            continue
        served = response.json()["reply"]
        said = verdict(row["category"], reaction_class(served))
        fits += said == "fits"
        wrong += said == "wrong"
        if said != "fits":
            misses.append(f"{row['text']} -> {served}")
    n = len(rows)
    return {"fits": round(fits / n, 4), "wrong": wrong, "unanswered": unanswered, "utterances": n, "misses": misses}


def sts_figures(client: httpx.Client, name: str) -> dict[str, Any]:
    data = sts_set(name)
    scores: list[float] = []
    for start in range(0, len(data.pairs), MAX_PAIRS):
        chunk = [list(p) for p in data.pairs[start : start + MAX_PAIRS]]
        scores += client.post("/similar", json={"pairs": chunk}).raise_for_status().json()["scores"]
    rho = spearmanr(np.array(scores), np.array(data.gold)).statistic
    return {"spearman": round(100 * float(rho), 2), "pairs": len(data.pairs)}


def languages(bundle: Path) -> list[str]:
    manifest = open_bundle(bundle)
    if manifest.language != "mul":
        return [manifest.language]
    return list(manifest.languages) or ["en", "ko"]  # a multilingual bundle that names none: both sets


def score(bundle: Path, label: str, reactions_only: bool = False, chatterbot: bool = True) -> list[dict[str, Any]]:
    """Every set's row for `bundle`; with `reactions_only`, only the labelled reactions' (they answer
    from the bundle's classifier alone, so a refitted classifier needs no other set rerun). Without
    `chatterbot`, chatterbot-corpus is not scored (its replies still serve the labelled reactions):
    it is a floor, not what an encoder is chosen on, and two requests a context make it the slowest set."""
    manifest = open_bundle(bundle)
    base = {
        "model": label,
        "bundle": manifest.name,
        "checksum": manifest.checksum,  # what models/release.py matches the candidate's rows by
        "trained_on_chatterbot": trained_on_chatterbot(bundle),
        "cpu": cpu_description(),
    }
    rows = []
    with tempfile.TemporaryDirectory() as work, service(bundle, Path(work)) as client:
        for language in languages(bundle):
            if language not in ("en", "ko"):
                continue
            data = chatterbot_set(language)
            upload(client, data.replies, language)  # a set to serve from: the reactions ride on its index
            if reactions_only:
                rows.append({**base, "set": f"reactions-labelled-{language}", **labelled_reactions(client, language)})
                print(json.dumps(rows[-1], ensure_ascii=False), flush=True)
                continue
            if chatterbot:
                started = time.perf_counter()
                figures = reply_figures(client, data)
                rows.append({**base, "set": f"chatterbot-{language}", **figures})
                print(json.dumps(rows[-1]) + f"  ({time.perf_counter() - started:.0f}s)", flush=True)
            rows.append({**base, "set": f"reactions-labelled-{language}", **labelled_reactions(client, language)})
            print(json.dumps(rows[-1], ensure_ascii=False), flush=True)
            for name in available_human():
                data = human_set(name)
                if data.language == language:
                    started = time.perf_counter()
                    upload(client, data.replies, language)
                    rows.append({**base, "set": name, **reply_figures(client, data, reactions=False)})
                    print(json.dumps(rows[-1]) + f"  ({time.perf_counter() - started:.0f}s)", flush=True)
            for name in available_sts():
                if sts_set(name).language == language:
                    rows.append({**base, "set": name, **sts_figures(client, name)})
                    print(json.dumps(rows[-1]), flush=True)
    return rows


def trained_on_chatterbot(bundle: Path) -> bool:
    """Whether the bundle's weights saw chatterbot-corpus (in any language): its figures here are not clean."""
    training = open_bundle(bundle).training
    return saw_chatterbot(training.get("layers", {}) or training.get("teacher", {}))


def markdown(rows: list[dict[str, Any]], cpu: str) -> str:
    lines = [
        "Out-of-domain sets through the live API (`python -m bench.ood`), every bundle in one run on "
        f"{cpu}. chatterbot-corpus: every distinct reply of the language uploaded as the only candidates, "
        "`/reply` with reply matching alone per distinct context (R@1, R@10), and with the default strategies "
        "(reaction share). STS: Spearman x 100 of `/similar` pair scores. * trained on chatterbot-corpus "
        "(another language folder of it): not a clean figure.",
        "",
        "| model | set | R@1 | R@10 | half A R@1 / R@10 | half B R@1 / R@10 | reactions | Spearman "
        "| contexts / pairs | candidates |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        mark = " *" if r["trained_on_chatterbot"] else ""
        if "fits" in r:
            lines.append(
                f"| {r['model']}{mark} | {r['set']} | reaction fits {r['fits']:.1%}, wrong {r['wrong']}"
                f" | | | | | | {r['utterances']} | |"
            )
        elif "spearman" in r:
            lines.append(f"| {r['model']}{mark} | {r['set']} | | | | | | {r['spearman']:.1f} | {r['pairs']} | |")
        else:
            halves = [f"{r[h]['r_at_1']:.3f} / {r[h]['r_at_10']:.3f}" if h in r else "" for h in ("half_a", "half_b")]
            share = f"{r['reaction_share']:.1%}" if "reaction_share" in r else ""
            lines.append(
                f"| {r['model']}{mark} | {r['set']} | {r['r_at_1']:.3f} | {r['r_at_10']:.3f} | {halves[0]} "
                f"| {halves[1]} | {share} | | {r['contexts']} | {r['candidates']} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--bundle", type=Path, action="append", help="repeatable; default: " + ", ".join(map(str, DEFAULT_BUNDLES))
    )
    parser.add_argument("--label", action="append", default=[], help="BUNDLE_DIR=name for the rows' model column")
    parser.add_argument("--out", type=Path, default=ROOT / "reports")
    parser.add_argument(
        "--reactions-only",
        action="store_true",
        help="rerun only the labelled reactions; they replace the same bundle's rows in OUT/ood.json",
    )
    args = parser.parse_args()
    labels = dict(item.split("=", 1) for item in args.label)
    rows: list[dict[str, Any]] = []
    for bundle in args.bundle or [b for b in DEFAULT_BUNDLES if b.is_dir()]:
        rows += score(bundle, labels.get(str(bundle), open_bundle(bundle).name), args.reactions_only)
    if args.reactions_only:
        rows = merged(json.loads((args.out / "ood.json").read_text(encoding="utf-8")), rows)
    print(write_rows(rows, args.out))


def merged(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`old` with each row that `new` measured again (same bundle checksum and set) replaced in place."""
    fresh = {(r["checksum"], r["set"]): r for r in new}
    rows = [fresh.pop((r["checksum"], r["set"]), r) for r in old]
    return rows + list(fresh.values())


def write_rows(rows: list[dict[str, Any]], out: Path) -> str:
    """reports/ood.{json,md}: what models/release.py reads, and its table."""
    text = markdown(rows, cpu_description())
    out.mkdir(parents=True, exist_ok=True)
    (out / "ood.json").write_text(json.dumps(rows, indent=2, ensure_ascii=False) + "\n")
    (out / "ood.md").write_text(text)
    return text


if __name__ == "__main__":
    main()
