"""What the embedding cache's shared writes buy, on replayed conversations.

    python -m bench.cache_policy [--replicas 1 2 4] [--conversations N]

Replays the corpus' held-out conversations (test and validation) as the
service sees sessions: every turn is a `/reply` whose texts are its last turn
and its joined context (the bundle's `max_context_turns`, 3 here), with the
conversations interleaved as concurrent users would be and each request sent
to the next replica in turn. Each replica has the real `EmbeddingCache`, with
the service's default local size; all share one store. Two policies:

- every miss: each encoded vector is written to the shared store, and each
  text missing in the process is looked up there (before; `EveryMissCache`);
- short, asked again: only texts of at most `SHARED_MAX_CHARS` characters go
  to the shared store, when their process is asked for them a second time,
  and only they are looked up there (`EmbeddingCache`, now).

Counts, per policy and replica count: texts asked, requests that waited for
a shared-store lookup, shared-store writes, hits in the process, hits in the
shared store, and encodes. No model runs: the
vectors are placeholders, and only the keys decide what hits. Writes
reports/cache_policy.{md,json}.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

import numpy as np

from app.config import Settings
from app.engine.cache import LOCAL_ONLY, EmbeddingCache
from app.engine.kv import Guarded, MemoryKV
from bench import reports
from index.corpus import load_conversations, split_of

ROOT = Path(__file__).resolve().parents[1]
CONTEXT_TURNS = 3  # the release bundle's max_context_turns
DIM = 4  # placeholder vectors: the policy depends on keys, not values


class EveryMissCache(EmbeddingCache):
    """The policy before `EmbeddingCache`'s: every key is shared, whatever its text's length, and
    every vector goes to the shared store once encoded, not once asked for again."""

    def key(self, model_checksum: str, kind: str, text: str, lowercase: bool | None = None) -> str:
        # Without the local-only prefix, a miss is looked up in the shared store.
        return super().key(model_checksum, kind, text, lowercase).removeprefix(LOCAL_ONLY)

    async def put_many(self, items: dict[str, np.ndarray], share: bool = True) -> None:
        for key, vector in items.items():
            self._remember(key, vector)
        if share:
            self._share_in_background(items)  # nothing without a shared store


def requests(limit: int) -> list[list[str]]:
    """Each request's texts (last turn, joined context), conversations interleaved turn by turn."""
    conversations = [c for c in load_conversations() if split_of(c.id) != "train"][:limit]
    longest = max(len(c.turns) for c in conversations)
    out = []
    for i in range(longest):
        for c in conversations:
            if i < len(c.turns):
                window = c.turns[max(0, i + 1 - CONTEXT_TURNS) : i + 1]
                out.append(list(dict.fromkeys([window[-1], " | ".join(window)])))
    return out


async def replay(texts_per_request: list[list[str]], replicas: int, every_miss: bool) -> dict[str, Any]:
    settings = Settings()
    store = Guarded(MemoryKV(), retry_after_s=1.0)
    policy = EveryMissCache if every_miss else EmbeddingCache
    caches = [policy(store, settings.cache_local_entries, 60) for _ in range(replicas)]
    asked = local_hits = shared_hits = encoded = 0
    vector = np.zeros(DIM, dtype=np.float32)
    for n, texts in enumerate(texts_per_request):
        cache = caches[n % replicas]
        keys = [cache.key("checksum", "context", t) for t in texts]
        in_process = sum(k in cache._local for k in keys)
        found = await cache.get_many(keys, DIM)
        missing = [k for k, v in zip(keys, found, strict=True) if v is None]
        await cache.put_many({k: vector for k in missing})
        await cache.flush()
        asked += len(keys)
        local_hits += in_process
        shared_hits += len(keys) - in_process - len(missing)
        encoded += len(missing)
    return {
        "replicas": replicas,
        "policy": "every miss" if every_miss else "short, asked again",
        "texts_asked": asked,
        "shared_reads": sum(c.shared_reads for c in caches),
        "shared_writes": sum(c.shared_writes for c in caches),
        "local_hits": local_hits,
        "shared_hits": shared_hits,
        "encoded": encoded,
    }


def markdown(report: dict[str, Any]) -> str:
    lines = [
        f"`{report['command']}`: {report['requests']} `/reply` requests from {report['conversations']} held-out "
        "conversations, replayed as interleaved sessions.",
        "",
        "| replicas | policy | texts asked | requests waiting on the shared store | shared writes "
        "| hits in process | hits in shared store | encoded |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in report["runs"]:
        lines.append(
            f"| {r['replicas']} | {r['policy']} | {r['texts_asked']} | {r['shared_reads']} | {r['shared_writes']} "
            f"| {r['local_hits']} "
            f"| {r['shared_hits']} | {r['encoded']} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--conversations", type=int, default=2000)
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "cache_policy")
    args = parser.parse_args()
    texts = requests(args.conversations)
    runs = [
        asyncio.run(replay(texts, replicas, every_miss)) for replicas in args.replicas for every_miss in (True, False)
    ]
    report = {
        "command": "python -m bench.cache_policy " + " ".join(sys.argv[1:]),
        "conversations": args.conversations,
        "requests": len(texts),
        "runs": runs,
    }
    reports.write(args.out, report, markdown(report))


if __name__ == "__main__":
    main()
