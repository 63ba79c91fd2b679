"""The index build's encode with onnxruntime threads spinning between a run's ops, against sleeping.

    python -m bench.encode_spin      # every text a full chitchat build encodes, ~4.5 min with VNNI

Each of the build's length-sorted 1,024-text chunks is split into alternate halves; one half goes
through each session, and which goes first alternates, so both ways meet the same lengths and the
same moments of a shared VM's drift. `python -m index` spins (index/__main__.py); the service's
reindexes sleep. Writes reports/encode_spin.{json,md}.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from bench.reports import write
from bench.service import cpu_description
from core.bundle import RELEASE_BUNDLE, open_bundle
from core.encoder import Encoder
from index.build import ENCODE_CHUNK, corpus_candidates, tables

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    bundle = open_bundle(RELEASE_BUNDLE)
    t = tables(corpus_candidates(bundle.max_context_turns))
    texts = list(dict.fromkeys(t.reply_texts + t.query_texts))
    order = np.argsort([len(x) for x in texts], kind="stable")
    sleeping = Encoder(RELEASE_BUNDLE, bundle)
    sessions = {"sleeping": sleeping, "spinning": sleeping.sibling(spin=True)}
    seconds = dict.fromkeys(sessions, 0.0)
    for i, start in enumerate(range(0, len(texts), ENCODE_CHUNK)):
        chunk = [texts[j] for j in order[start : start + ENCODE_CHUNK]]
        names = list(sessions) if i % 2 else list(sessions)[::-1]
        for name, half in zip(names, (chunk[0::2], chunk[1::2]), strict=True):
            started = time.perf_counter()
            sessions[name].encode(half, "reply")
            seconds[name] += time.perf_counter() - started
    report = {
        "command": "python -m bench.encode_spin",
        "cpu": cpu_description(),
        "bundle": bundle.name,
        "texts": len(texts),
        "seconds": {k: round(v, 1) for k, v in seconds.items()},
        "spinning_over_sleeping": round(seconds["spinning"] / seconds["sleeping"], 3),
    }
    text = (
        f"# The index build's encode: spinning against sleeping threads\n\n`{report['command']}` on {report['cpu']}, "
        f"{bundle.name}, the {len(texts):,} texts of a full chitchat build, alternate halves of each chunk:\n\n"
        f"| threads | seconds |\n|---|---|\n| sleeping | {report['seconds']['sleeping']} |\n"
        f"| spinning | {report['seconds']['spinning']} |\n\nSpinning takes "
        f"{report['spinning_over_sleeping']:.3f}× the time of sleeping.\n"
    )
    write(ROOT / "reports" / "encode_spin", report, text)


if __name__ == "__main__":
    main()
