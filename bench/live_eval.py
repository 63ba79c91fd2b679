"""A held-out set scored through the live API, the way an outside evaluator does it.

    python -m bench.live_eval [--bundle DIR ...] [--contexts 2000]

For each bundle: a fresh service with no index; every reply of the test
split's conversations (about 12k) uploaded through the admin API as the only
candidates; then /reply, with default options and k = 10, for held-out
contexts. Reported: how often the reply the person sent comes first, how
often it is among the 10 candidates, how often the answer is a near copy of
a turn of the context, and which strategy answered. Writes reports/live_eval.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from bench.service import free_port
from core.bundle import RELEASE_BUNDLE, open_bundle
from core.text import Signature, echoes, normalize
from index.corpus import load_pairs

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "live-eval"


def wait(url: str, ok: Any, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if ok(httpx.get(url, timeout=2)):
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(url)


def score(bundle: Path, contexts: int, seed: int) -> dict[str, Any]:
    pairs = [p for p in load_pairs("test", 3) if len(p.reply) <= 280]
    replies = list(dict.fromkeys(p.reply for p in pairs))
    chosen = random.Random(seed).sample(pairs, min(contexts, len(pairs)))
    with tempfile.TemporaryDirectory() as work:
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("CHITCHAT_")}
        env.update(CHITCHAT_ARTIFACTS_DIR=work, CHITCHAT_BUNDLE_DIR=str(bundle), CHITCHAT_ADMIN_TOKEN=TOKEN)
        command = [sys.executable, "-m", "uvicorn", "app.main:create_app", "--factory", "--port", str(port)]
        server = subprocess.Popen([*command, "--log-level", "warning"], cwd=ROOT, env=env)
        url, auth = f"http://127.0.0.1:{port}", {"authorization": f"Bearer {TOKEN}"}
        try:
            wait(f"{url}/readyz", lambda r: r.json().get("problem") not in (None, "loading"))
            records = [{"reply": r, "id": f"t{i}"} for i, r in enumerate(replies)]
            job = httpx.post(f"{url}/admin/candidates?mode=replace", json=records, headers=auth, timeout=120).json()
            wait(f"{url}/readyz", lambda r: r.status_code == 200, timeout_s=1800)
            state = httpx.get(f"{url}/admin/jobs/{job['job_id']}", headers=auth).json()
            first = top10 = echoed = 0
            sources: Counter[str] = Counter()
            with httpx.Client(base_url=url, timeout=30) as client:
                for pair in chosen:
                    answer = client.post("/reply", json={"context": list(pair.context), "k": 10}).json()
                    texts = [normalize(c["text"]) for c in answer["candidates"]]
                    first += normalize(answer["reply"]) == normalize(pair.reply)
                    top10 += normalize(pair.reply) in texts
                    echoed += echoes(answer["reply"], [Signature.of(t) for t in pair.context])
                    sources[answer["source"]] += 1
        finally:
            server.terminate()
            server.wait(timeout=30)
    n = len(chosen)
    return {
        "bundle": open_bundle(bundle).name,
        "candidates": len(replies),
        "contexts": n,
        "first": round(first / n, 4),
        "top_10": round(top10 / n, 4),
        "echoed": echoed,
        "sources": {k: round(v / n, 4) for k, v in sources.items()},
        "index_build_s": round(state["updated_at"] - state["created_at"], 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bundle", type=Path, nargs="+", default=[RELEASE_BUNDLE])
    parser.add_argument("--contexts", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=ROOT / "reports")
    args = parser.parse_args()
    rows = []
    for bundle in args.bundle:
        rows.append(score(bundle, args.contexts, args.seed))
        print(json.dumps(rows[-1]), flush=True)
    lines = [
        f"The test split's {rows[0]['candidates']:,} replies uploaded through the admin API as the only candidates; "
        f"/reply with default options (k = 10) for {rows[0]['contexts']:,} held-out contexts.",
        "",
        "| bundle | right reply first | in the top 10 | answered with a near copy of a context turn | sources |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        shares = ", ".join(f"{k} {v:.0%}" for k, v in sorted(r["sources"].items()))
        lines.append(f"| {r['bundle']} | {r['first']:.3f} | {r['top_10']:.3f} | {r['echoed']} | {shares} |")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "live_eval.json").write_text(json.dumps(rows, indent=2) + "\n")
    (args.out / "live_eval.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
