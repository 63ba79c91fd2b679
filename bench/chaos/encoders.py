"""Scenario 22: an English set and a Korean set, each built with its own shipped encoder, served side
by side under load, from one process and then from three replicas on one Redis. Every answer must come
from the set it asked (no id of the other set or of the default one), echo that set and its version,
and every replica must say each set's encoder in `/info?set=`.

`/info` says what a set is configured with, not what encoded a request. So a third of the requests
are probes: a stored query behind a filler word ("so ...", "근데 ..."), mostly a text no cache holds
yet, answered by query similarity alone. Only the set's own encoder puts it nearest its stored query: a
vector from the other encoder (another space of the same width) lands on an unrelated one."""

from __future__ import annotations

import json
import random
import threading
import time
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np

from bench.chaos.context import Context
from bench.chaos.harness import ROOT, Service, wait_for
from core.bundle import RELEASE_ROOT

KOREAN_TEXTS = ROOT / "models" / "data" / "korean_conversations.jsonl"
RECORDS_PER_SET = 200
CLIENTS = 4  # threads: enough to interleave the two sets' batches on 2 cores, not to overload them
CONVERGE_TIMEOUT_S = 60.0  # replicas find a set made elsewhere at their next poll (or at once, told by Redis)
PROBE_SHARE = 1 / 3
# Measured here: each encoder finds 100% of its own set's probes and 0% of the other set's, so a share
# under this is the wrong encoder's vectors for some requests; the margin is for a near-duplicate query.
PROBES_FOUND_BAR = 0.98
TOPICS = [
    "coffee", "hiking", "my cat", "the weather", "jazz", "pizza", "running", "chess", "gardening", "old movies",
    "the beach", "baking bread", "video games", "my new job", "camping", "sushi", "football", "painting",
    "the train ride", "my garden",
]  # fmt: skip
ASKS = [
    "do you like {t}?", "what do you think about {t}?", "have you tried {t} lately?", "i can't stop thinking about {t}",
    "tell me something about {t}", "is {t} fun for you?", "i spent all weekend on {t}", "{t} made my day today",
    "should i give {t} a go?", "why does everyone love {t}?",
]  # fmt: skip
ANSWERS = [
    "oh i love {t}, it always cheers me up", "{t} is fine, but i'd rather sleep in",
    "i tried {t} once and laughed a lot", "honestly {t} is my favourite thing", "tell me more about {t}!",
    "{t} sounds great, count me in next time", "i never got into {t} myself",
    "my sister talks about {t} all the time", "that's the best thing about {t}", "wow, {t} every weekend? impressive",
]  # fmt: skip


@dataclass(frozen=True)
class ServedSet:
    """One of the two sets: its records' ids, the contexts the load sends it and the encoder it must name."""

    name: str
    encoder: str
    records: list[dict[str, str]]
    contexts: list[list[str]]  # each a /reply context, oldest turn first
    fillers: tuple[str, ...]  # a probe's first word: 10 of them make 2,000 probe texts of 200 queries

    @property
    def ids(self) -> frozenset[str]:
        return frozenset(r["id"] for r in self.records)

    def ids_of_query(self, query: str) -> frozenset[str]:
        """The records stored under this query: a probe's right answers (a Korean turn may repeat)."""
        return frozenset(r["id"] for r in self.records if r["query"] == query)


def english_set(encoder: str, n: int = RECORDS_PER_SET) -> ServedSet:
    """n distinct (query, reply) pairs; the load asks their queries, some with a turn before."""
    records = [
        {
            "query": ASKS[(i // len(TOPICS)) % len(ASKS)].format(t=TOPICS[i % len(TOPICS)]),
            # A topic's 10 records take its 10 answers: 200 distinct replies, as distinct as the queries.
            "reply": ANSWERS[(i // len(TOPICS) + i) % len(ANSWERS)].format(t=TOPICS[i % len(TOPICS)]),
            "id": f"en-{i}",
        }
        for i in range(n)
    ]
    contexts = [[r["query"]] for r in records] + [["hey there!", r["query"]] for r in records[::3]]
    fillers = ("so", "hey,", "ok", "well,", "hmm", "listen,", "by the way,", "honestly,", "wait,", "yo")
    return ServedSet("english", encoder, records, contexts, fillers)


def korean_set(encoder: str, n: int = RECORDS_PER_SET) -> ServedSet:
    """The first n consecutive turn pairs of our written Korean conversations; the load asks every turn
    of them, the n stored queries and the turns after (unseen), each with the turn before it."""
    conversations = [json.loads(line)["turns"] for line in KOREAN_TEXTS.read_text().splitlines() if line.strip()]
    pairs = [(turns[j], turns[j + 1]) for turns in conversations for j in range(len(turns) - 1)]
    if len(pairs) < n:
        raise RuntimeError(f"{KOREAN_TEXTS} holds {len(pairs)} turn pairs, not {n}")
    records = [{"query": q, "reply": r, "id": f"ko-{i}", "language": "ko"} for i, (q, r) in enumerate(pairs[:n])]
    contexts = [turns[max(0, j - 1) : j + 1] for turns in conversations for j in range(len(turns))]
    fillers = ("근데", "아", "야", "음", "그래서", "있잖아", "혹시", "솔직히", "참", "저기")
    return ServedSet("korean", encoder, records, contexts[: 2 * n], fillers)


def pick_encoders(encoders: dict[str, Any]) -> tuple[str, str] | None:
    """(English's, Korean's) from what `GET /admin/sets` says the service ships: MiniLM for English,
    the default for Korean (the release's multilingual e5), else another one; None when it ships one."""
    available: list[str] = encoders["available"]
    default: str = encoders["default"]
    english = "minilm" if "minilm" in available else default
    others = [name for name in available if name != english]
    if not others:
        return None
    korean = default if default != english else next((n for n in others if "e5" in n), others[0])
    return english, korean


def upload_sets(service: Service, sets: list[ServedSet]) -> dict[str, Any]:
    """Both sets' first uploads, each naming its encoder, sent before either job is awaited (so the two
    encoders build side by side); seconds each job was waited for. Raises unless both succeed."""
    jobs = {}
    for s in sets:
        response = service.admin("POST", f"/admin/sets/{s.name}/candidates?encoder={s.encoder}", json=s.records)
        if response.status_code != 202:
            raise RuntimeError(f"upload of {s.name} refused: {response.status_code} {response.text[:200]}")
        jobs[s.name] = response.json()["job_id"]
    done = {name: service.wait_job(job_id, timeout_s=300) for name, job_id in jobs.items()}
    failed = {name: job.get("error") for name, job in done.items() if job["state"] != "succeeded"}
    if failed:
        raise RuntimeError(f"set jobs failed: {failed}")
    return {name: job["waited_s"] for name, job in done.items()}


def encoders_named(services: list[Service], sets: list[ServedSet]) -> list[dict[str, str | None]]:
    """Per replica, set -> the encoder its `/info?set=` names (None where it does not answer 200)."""
    named = []
    for service in services:
        seen: dict[str, str | None] = {}
        for s in sets:
            response = httpx.get(f"{service.url}/info", params={"set": s.name}, timeout=10)
            seen[s.name] = response.json()["model"]["encoder"] if response.status_code == 200 else None
        named.append(seen)
    return named


def versions_of(service: Service) -> dict[str, str]:
    """set -> the version it serves, as the one that built them says: what every answer must name."""
    body = service.admin("GET", "/admin/sets").json()
    return {s["name"]: s["version"] for s in body["sets"]}


def request(s: ServedSet, rng: random.Random) -> tuple[dict[str, Any], str | None]:
    """A /reply body for set s, and the stored query a probe hides (None for the rest)."""
    if rng.random() >= PROBE_SHARE:
        return {"context": rng.choice(s.contexts), "set": s.name, "k": 3}, None
    query = rng.choice(s.records)["query"]
    # Query similarity alone, at any cosine: the answer is the nearest stored query's, whatever its score.
    only_queries = {"strategies": ["query_similarity"], "thresholds": {"query_similarity": 0.0}}
    return {"context": [f"{rng.choice(s.fillers)} {query}"], "set": s.name, "k": 3, **only_queries}, query


def ask(urls: list[str], sets: list[ServedSet], until: float, seed: int, out: list[dict[str, Any]]) -> None:
    """One client: a random set's random request to a random replica until `until`, each answer kept
    whole for the checks (or its status: an error's name when there was no HTTP answer)."""
    rng = random.Random(seed)
    clients = {url: httpx.Client(base_url=url, timeout=10) for url in urls}
    try:
        while time.perf_counter() < until:
            s = rng.choice(sets)
            url = rng.choice(urls)
            body, probed = request(s, rng)
            started = time.perf_counter()
            row: dict[str, Any] = {"set": s.name, "url": url, "probed": probed}
            try:
                response = clients[url].post("/reply", json=body)
                row["status"] = response.status_code
                if response.status_code == 200:
                    row["answer"] = response.json()
            except httpx.HTTPError as error:
                row["status"] = type(error).__name__
            row["latency_ms"] = (time.perf_counter() - started) * 1000
            out.append(row)  # list.append is atomic under the GIL: the clients share one list
    finally:
        for client in clients.values():
            client.close()


def load(urls: list[str], sets: list[ServedSet], seconds: float, tag: int) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    until = time.perf_counter() + seconds
    threads = [threading.Thread(target=ask, args=(urls, sets, until, tag * 100 + i, results)) for i in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def answered_ids(answer: dict[str, Any]) -> list[tuple[str, str]]:
    """(id, source) of the reply and of every candidate shown beside it."""
    return [(answer["id"], answer["source"]), *((c["id"], c["source"]) for c in answer["candidates"])]


def check(results: list[dict[str, Any]], sets: list[ServedSet], versions: dict[str, str]) -> dict[str, Any]:
    """What the answers say against what was asked. An id is foreign unless it is one of the asked set's
    records, or a reaction of the set's encoder's own classifier (`reaction:<label>`, in no set: counted
    apart as `model_reactions`)."""
    ids = {s.name: s.ids for s in sets}
    figures: dict[str, Any] = {"requests": len(results), "ok_200": 0, "status_5xx": 0, "other_status": {}}
    figures |= {"foreign_ids": 0, "wrong_set": 0, "wrong_version": 0, "model_reactions": 0, "foreign_examples": []}
    for r in results:
        status = r["status"]
        if status == 200:
            figures["ok_200"] += 1
        elif isinstance(status, int) and status >= 500:
            figures["status_5xx"] += 1
        else:
            figures["other_status"][str(status)] = figures["other_status"].get(str(status), 0) + 1
        answer = r.get("answer")
        if answer is None:
            continue
        figures["wrong_set"] += answer["set"] != r["set"]
        figures["wrong_version"] += answer["index_version"] != versions[r["set"]]
        for candidate_id, source in answered_ids(answer):
            if candidate_id in ids[r["set"]]:
                continue
            if source == "reaction" and candidate_id.startswith("reaction:"):
                figures["model_reactions"] += 1
                continue
            figures["foreign_ids"] += 1
            if len(figures["foreign_examples"]) < 3:
                figures["foreign_examples"].append(f"{r['set']} answered {candidate_id} ({source})")
    for s in sets:
        mine = [r for r in results if r["set"] == s.name]
        latencies_ms = np.array([r["latency_ms"] for r in mine if r["status"] == 200] or [0.0])
        probes = [r for r in mine if r["probed"] is not None and "answer" in r]
        found = sum(r["answer"]["id"] in s.ids_of_query(r["probed"]) for r in probes)
        figures[s.name] = {
            "ok_200": sum(r["status"] == 200 for r in mine),
            "p50_ms": round(float(np.percentile(latencies_ms, 50)), 1),
            "p99_ms": round(float(np.percentile(latencies_ms, 99)), 1),
            "probes": len(probes),
            "probes_found": round(found / max(1, len(probes)), 3),  # share answered with the hidden query's reply
        }
    return figures


def serve_both(services: list[Service], sets: list[ServedSet], seconds: float, tag: int) -> dict[str, Any]:
    """Both sets uploaded through the first service; every service found serving them with the right
    encoder; the load over all of them; the encoders asked again after it."""
    jobs_s = upload_sets(services[0], sets)
    want = {s.name: s.encoder for s in sets}
    try:
        found_s: float | None = wait_for(
            lambda: all(n == want for n in encoders_named(services, sets)), CONVERGE_TIMEOUT_S, 0.25
        )
    except TimeoutError:
        found_s = None  # the load still runs: its answers say what the laggard served meanwhile
    versions = versions_of(services[0])
    results = load([s.url for s in services], sets, seconds, tag)
    after = encoders_named(services, sets)
    figures = check(results, sets, versions)
    figures |= {
        "jobs_s": jobs_s,
        "all_serving_s": round(found_s, 1) if found_s is not None else None,
        "encoders_right_after": all(n == want for n in after),
    }
    if not figures["encoders_right_after"]:
        figures["encoders_named"] = after
    return figures


def passed(figures: dict[str, Any], sets: list[ServedSet]) -> bool:
    return (
        figures["status_5xx"] == 0
        and figures["foreign_ids"] == 0
        and figures["wrong_set"] == 0
        and figures["wrong_version"] == 0
        and figures["all_serving_s"] is not None
        and figures["encoders_right_after"]
        and all(figures[s.name]["probes"] > 0 for s in sets)  # else the run checked nothing for that set
        and all(figures[s.name]["probes_found"] >= PROBES_FOUND_BAR for s in sets)
    )


def two_sets_two_encoders(ctx: Context) -> dict[str, Any]:
    seconds = ctx.durations.encoders_load
    encoders_dir = str(ctx.encoders_dir or RELEASE_ROOT)  # the service's own default unless --encoders-dir
    # One process without Redis, as `make run` serves; the sets live in its own artifacts copy.
    with ctx.service("s22", None, CHITCHAT_ENCODERS_DIR=encoders_dir) as service:
        encoders = service.admin("GET", "/admin/sets").json()["encoders"]
        chosen = pick_encoders(encoders)
        if chosen is None:
            reason = f"the service ships one encoder ({encoders['available']}): two are needed"
            return {"skipped": reason, "encoders": encoders, "pass": None}
        sets = [english_set(chosen[0]), korean_set(chosen[1])]
        one = serve_both([service], sets, seconds, tag=1)
    with ctx.redis() as redis, ctx.replicas("s22r", redis, CHITCHAT_ENCODERS_DIR=encoders_dir) as replicas:
        three = serve_both(replicas, sets, seconds, tag=2)
    cases = {"one_process": one, "three_replicas": three}
    return {**totals(cases, sets), **cases, "pass": passed(one, sets) and passed(three, sets)}


def totals(cases: dict[str, dict[str, Any]], sets: list[ServedSet]) -> dict[str, Any]:
    """The bar's figures over both runs, first in the report's row (which cuts the details short)."""
    runs = cases.values()
    return {
        "encoders": {s.name: s.encoder for s in sets},
        "answers": sum(c["ok_200"] for c in runs),
        "status_5xx": sum(c["status_5xx"] for c in runs),
        "foreign_ids": sum(c["foreign_ids"] for c in runs),
        "wrong_set_or_version": sum(c["wrong_set"] + c["wrong_version"] for c in runs),
        "encoders_right_everywhere": all(c["all_serving_s"] is not None and c["encoders_right_after"] for c in runs),
        "probes_found_min": min(c[s.name]["probes_found"] for c in runs for s in sets),
    }
