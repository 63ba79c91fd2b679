"""Which encoder session a lone request runs on, chosen at load on the CPU at hand.

A session whose threads spin within a run skips about a hundred thread
wake-ups in one context's pass. Whether that pays depends on the CPU
(docs/experiments.md), so at
load both sessions encode the same short contexts, taking turns, and the one
with the lower p50 serves batches of one request. /info reports both figures,
the choice and the CPU.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from core.encoder import OUTPUT_NAMES, Encoder
from core.machine import cpu

PROBES = (
    "hi! how are you?",
    "do you like dogs? i have a golden retriever",
    "i just got back from a week in the mountains, it was great",
    "what do you do for fun on weekends?",
)
ROUNDS = 5  # each probe this many times per session, the sessions taking turns


def choose_lone_session(encoder: Encoder, spinning: Encoder) -> dict[str, Any]:
    """Times both sessions on PROBES and gives `encoder.alone` the spinning one if it is faster."""
    rows = encoder.tokenize(list(PROBES), "context")
    outputs = [OUTPUT_NAMES["context"]]
    seconds: dict[str, list[float]] = {"sleeping": [], "spinning": []}
    sessions = {"sleeping": encoder, "spinning": spinning}
    for session in sessions.values():  # the first run of a session allocates its buffers
        session.run_ids(rows[:1], outputs)
    for _ in range(ROUNDS):
        for name, session in sessions.items():
            for row in rows:
                started = time.perf_counter()
                session.run_ids([row], outputs)
                seconds[name].append(time.perf_counter() - started)
    p50_ms = {name: round(1000 * statistics.median(values), 3) for name, values in seconds.items()}
    chosen = "spinning" if p50_ms["spinning"] < p50_ms["sleeping"] else "sleeping"
    encoder.alone = spinning if chosen == "spinning" else None
    return {"lone_request_session": chosen, "p50_ms": p50_ms, "cpu": cpu()}
