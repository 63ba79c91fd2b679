"""The rest of the default index, built while the first slice serves (`python -m index --first-slice`).

The slice's marker (index/first_slice.py) says a full build is owed. Once the service is up, this
submits it as an ordinary reindex job of the default set (mode "replace", the chitchat train
candidates and the shipped Korean ones), so it builds beside live traffic, swaps atomically and
replicas follow the pointer. Its chunks are kept on disk as they are encoded
(index/encode_cache.py): a restart submits the job again, and it encodes only what the killed one
had not finished. The marker goes when the full version serves; it also goes, with nothing built,
if the set has moved on from the slice (an upload or a rollback chose other candidates).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio.to_thread

from app.reindex.jobs import Job, JobStore
from app.reindex.reindexer import Busy
from core.store import IndexStore
from index.build import default_candidates
from index.first_slice import Owed, owed, settle

if TYPE_CHECKING:
    from app.reindex.set_admin import Admin

log = logging.getLogger(__name__)

RETRY_S = 15.0  # another replica holds the lock (it may be building this very job), or a build failed


@dataclass
class Progress:
    """What /info says of the owed build while it runs."""

    state: str = "pending"  # pending, building, done, failed, dropped
    job_id: str | None = None
    replies_total: int = 0
    fraction: float = 0.0  # of the whole build, encoding counted as 90% of it
    started_at: float = 0.0
    error: str | None = None

    def describe(self) -> dict[str, Any]:
        elapsed = time.time() - self.started_at if self.started_at else 0.0
        eta = elapsed * (1 - self.fraction) / self.fraction if 0.02 < self.fraction < 1 else None
        return {
            "state": self.state,
            "job_id": self.job_id,
            "replies_indexed_of_total": [round(self.fraction * self.replies_total), self.replies_total],
            "seconds_left": None if eta is None else round(eta),
            **({"error": self.error} if self.error else {}),
        }


async def complete(admin: Admin, progress: Progress) -> None:
    """Builds what the slice's marker owes, retrying while another replica holds the lock."""
    target = admin.default
    store = target.candidate_set.store
    debt = owed(store.root)
    if debt is None:
        progress.state = "done"
        return
    progress.replies_total = debt.replies
    while True:
        if not _still_owed(store, debt):
            settle(store.root)
            progress.state = "dropped"
            log.info("first build: the default set moved on from the slice; the full build is not needed")
            return
        try:
            corpus = Path(debt.corpus) if debt.corpus else None
            candidates = await anyio.to_thread.run_sync(default_candidates, debt.max_context_turns, corpus, debt.korean)
            # Asked again by the job under the lock, as it starts and right before it swaps: an upload or
            # a rollback that lands while the corpus loads (seconds) wins over the build.
            job = target.reindexer.submit(
                "replace",
                candidates,
                report={"first_build": True},
                source=debt.source,
                still_wanted=lambda: _still_owed(store, debt),
            )
        except Busy:
            await asyncio.sleep(RETRY_S)
            continue
        except Exception as error:  # the corpus unreadable, Redis away: the slice serves on; try again
            progress.state, progress.error = "failed", f"{type(error).__name__}: {error}"
            log.warning("first build: could not start (%s); again in %.0f s", progress.error, RETRY_S)
            await asyncio.sleep(RETRY_S)
            continue
        progress.state, progress.job_id, progress.started_at = "building", job.id, time.time()
        log.info("first build: job %s indexes the %d replies of %s behind the slice", job.id, debt.replies, debt.source)
        finished = await _follow(target.reindexer.jobs, job.id, progress)
        if finished.state == "succeeded":
            settle(store.root)
            progress.state, progress.fraction = "done", 1.0
            log.info("first build: %s serves the full index", finished.version)
            return
        if not _still_owed(store, debt):  # superseded: dropped at the top of the loop, at once
            continue
        progress.state, progress.error = "failed", finished.error
        log.warning("first build: job %s failed (%s); again in %.0f s", job.id, finished.error, RETRY_S)
        await asyncio.sleep(RETRY_S)


def _still_owed(store: IndexStore, debt: Owed) -> bool:
    """Whether the default set's pointer still names the slice: no upload, rollback or other replica's
    build has replaced it. The pointer, not what this replica serves: only the lock's holder moves
    it, so the job's own answer, under the lock, holds until it swaps."""
    try:
        return store.current() == debt.slice_version
    except OSError:  # unreadable for now: no reason to drop the debt; the job asks again under the lock
        return True


async def _follow(jobs: JobStore, job_id: str, progress: Progress) -> Job:
    while True:
        job = await anyio.to_thread.run_sync(jobs.get, job_id)
        if job is not None:
            progress.fraction = 0.9 * job.progress if job.stage == "encode" else progress.fraction
            if job.state in ("succeeded", "failed"):
                return job
        await asyncio.sleep(1.0)
