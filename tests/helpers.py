"""What several test modules share: the tiny data set, settings and clients on the
test bundle, the admin upload helper. A helper module, not a test module: test
modules import from here (and fixtures from conftest), never from each other."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI

from app.config import Settings
from core.bundle import MANIFEST
from core.records import Candidate

REDIS_URL = "redis://127.0.0.1:6379/15"  # a database of its own, flushed by the tests

PAIRS = [
    ("hi! how are you?", "i'm good thanks, how about you?"),
    ("what's your favourite food?", "pizza, no contest"),
    ("do you like dogs?", "i love dogs, i have a golden retriever"),
    ("where are you from?", "i grew up in utah"),
    ("good night", "night! sleep well"),
    ("what do you do for fun?", "mostly hiking and board games"),
    ("i just got a new job!", "congrats! that's awesome"),
    ("my cat is sick", "oh no, i hope she gets better soon"),
    ("have you seen any good movies lately?", "i watched dune last week, it was great"),
    ("what's the weather like there?", "sunny and way too hot"),
    ("are you a student?", "yeah, i study computer science"),
    ("do you play any sports?", "i play volleyball on weekends"),
]
REPLY_ONLY = ["lol", "haha that's funny", "oh really?", "no way", "that sounds fun", "same here"]
TINY_PARITY_TEXTS = [q for q, _ in PAIRS] + [r for _, r in PAIRS]
REACTION_LABELS = ["lol", "oh no", "nice", "good night"]


def tiny_candidates() -> list[Candidate]:
    return [Candidate(reply=r, query=q) for q, r in PAIRS] + [Candidate(reply=r) for r in REPLY_ONLY]


def bundle_of(artifacts: Path) -> Path:
    """The one bundle a test artifacts/ directory holds."""
    return next(p for p in sorted((artifacts / "bundles").iterdir()) if (p / MANIFEST).is_file())


# The service's 250 ms Redis timeout is a latency bound; on a loaded CI machine a
# test that is about sessions or the cache would trip the bypass instead. Tests
# about timeouts set their own.
TEST_REDIS_TIMEOUT_MS = 1000


def settings_for(artifacts: Path, **overrides: object) -> Settings:
    """Settings serving the bundle under `artifacts` (not the release), with its index."""
    defaults = {
        "artifacts_dir": artifacts,
        "bundle_dir": bundle_of(artifacts),
        "encoders_dir": artifacts / "bundles",  # not the release's: the test bundles are what ships
        "reactions_dir": None,  # each tiny bundle's own head; tests/test_reaction_model.py loads a reader
        "redis_timeout_ms": TEST_REDIS_TIMEOUT_MS,
    }
    return Settings(**{**defaults, **overrides})  # type: ignore[arg-type]


def closed_port() -> int:
    """A port nothing listens on: bind, read the number, close."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


AppFactory = Callable[..., AbstractAsyncContextManager[httpx.AsyncClient]]


async def loaded(app: FastAPI, timeout_s: float = 60) -> None:
    """The lifespan starts serving at once and loads in the background; tests start once it is done."""
    for _ in range(int(timeout_s * 100)):
        if app.state.service.runtime is not None:
            return
        await asyncio.sleep(0.01)
    raise TimeoutError("the app did not finish loading")


TOKEN = "s3cret-token"
AUTH = {"authorization": f"Bearer {TOKEN}"}


async def wait_for(client: httpx.AsyncClient, job_id: str, timeout_s: float = 60) -> dict[str, Any]:
    for _ in range(int(timeout_s * 20)):
        job: dict[str, Any] = (await client.get(f"/admin/jobs/{job_id}", headers=AUTH)).json()
        if job["state"] in ("succeeded", "failed"):
            return job
        await asyncio.sleep(0.05)
    raise AssertionError(f"job {job_id} did not finish: {job}")


async def upload(client: httpx.AsyncClient, records: list[dict[str, Any]], mode: str = "append") -> dict[str, Any]:
    """Candidates uploaded through the admin API (the client's admin token must be TOKEN); the finished job."""
    path = "/admin/candidates/delete" if mode == "delete" else f"/admin/candidates?mode={mode}"
    response = await client.post(path, json=records, headers=AUTH)
    assert response.status_code == 202, response.text
    return await wait_for(client, response.json()["job_id"])
