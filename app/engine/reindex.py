"""Zero-downtime reindex: build off to the side, validate, swap, tell the replicas.

A job runs in a background thread at lower CPU priority (nice 10, inherited
by its encoder's threads), so live requests keep most of the machine. Nothing is written to the
candidate store or the current-version pointer until the new version has been
built and validated; a failed job changes nothing that serves.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from typing import Any

from app.engine.jobs import Job, JobStore, Lock
from app.engine.retriever import Serving
from app.engine.runtime import Runtime
from app.engine.stats import Buckets
from index.build import build_version
from index.candidates import RECORD_LINES, CandidateStore, apply, duplicates
from index.records import Candidate

log = logging.getLogger(__name__)

KEEP_VERSIONS = 3  # the serving one, the rollback target, and one more
BACKGROUND_NICE = 10  # Linux: per-thread niceness; inherited by threads it starts


class Busy(Exception):
    """Another reindex or rollback holds the lock."""


class Reindexer:
    def __init__(
        self,
        runtime: Runtime,
        candidates: CandidateStore,
        jobs: JobStore,
        lock: Lock,
        publish: Callable[[str], None],
    ) -> None:
        self.runtime = runtime
        self.candidates = candidates
        self.jobs = jobs
        self.lock = lock
        self.publish = publish
        self.outcomes: dict[str, int] = {}  # "succeeded"/"failed" -> jobs, for /metrics
        self.durations = Buckets((5, 15, 30, 60, 120, 300, 600))  # seconds from submit to done

    def submit(self, mode: str, upload: list[Candidate], report: dict[str, Any] | None = None) -> Job:
        job = Job.new(mode)
        job.counts = {"uploaded": len(upload)}
        job.report = dict(report or {})
        lines = job.report.pop(RECORD_LINES, None)  # a line per record: too big to keep in the job
        if not self.lock.acquire(job.token):
            raise Busy(f"reindex job {self.lock.holder()} is running")
        try:
            self.jobs.save(job)
            threading.Thread(target=self._run, args=(job, upload, lines), name=f"reindex-{job.id}", daemon=True).start()
        except BaseException:
            self.lock.release(job.token)
            raise
        return job

    def _run(self, job: Job, upload: list[Candidate], lines: list[int] | None = None) -> None:
        # Not Linux, or not permitted: the job runs at normal priority.
        with contextlib.suppress(OSError, AttributeError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BACKGROUND_NICE)
        stop_renewing = threading.Event()
        threading.Thread(target=self._renew, args=(job.token, stop_renewing), daemon=True).start()
        try:
            job.state = "running"
            self._build_and_swap(job, upload, lines)
            job.state, job.stage, job.progress = "succeeded", "done", 1.0
            log.info("reindex %s: now serving %s", job.id, job.version)
        except Exception as error:
            log.exception("reindex %s failed", job.id)
            job.state, job.error = "failed", f"{type(error).__name__}: {error}"
        finally:
            self.outcomes[job.state] = self.outcomes.get(job.state, 0) + 1
            self.durations.observe(time.time() - job.created_at)
            stop_renewing.set()
            # Released before the final state is saved: once a client sees
            # the job finished, its next upload must not get 409.
            self.lock.release(job.token)
            self.jobs.save(job)
            _return_freed_memory()

    def _renew(self, token: str, stop: threading.Event) -> None:
        while not stop.wait(5):
            try:
                if not self.lock.renew(token):
                    log.error("reindex %s no longer holds the lock; it will not swap", token)
            except Exception:  # a Redis blip must not kill the job; the TTL covers it
                log.warning("could not renew the reindex lock", exc_info=True)

    def _progress(self, job: Job, stage: str, fraction: float) -> None:
        job.stage, job.progress = stage, round(fraction, 3)
        self.jobs.save(job)

    def _build_and_swap(self, job: Job, upload: list[Candidate], lines: list[int] | None = None) -> None:
        model = self.runtime.current_model()
        serving = self.runtime.serving  # None until the first version exists: this job may build it
        job.previous_version = serving.index_version if serving else None
        self._progress(job, "load", 0.0)
        current = self.candidates.all()
        if not current and not self.candidates.written() and serving is not None:
            current = self.runtime.store.records(serving.index_version)
        merged = apply(current, job.mode, upload)
        if job.mode != "delete":  # only here are the stored records known: the upload alone cannot tell
            job.report["duplicates"] = duplicates(current, job.mode, upload, merged, lines)
        job.counts.update(candidates_before=len(current), candidates_after=len(merged))
        if not merged:
            raise ValueError("the upload would leave no candidates")

        # Its own session, created in this low-priority thread: its worker
        # threads inherit the niceness, so on an idle machine the build uses
        # every core and under load the scheduler favours live requests.
        encoder = model.encoder.sibling(self.runtime.settings.ort_intra_op_threads)
        manifest = build_version(
            merged,
            encoder,
            model.bundle.checksum,
            self.runtime.store,
            source=f"admin:{job.mode}",
            progress=False,
            on_progress=lambda stage, fraction: self._progress(job, stage, fraction),
        )
        job.version = manifest.version
        job.counts.update(replies=manifest.replies, queries=manifest.queries, encoded=manifest.encoded)

        self._progress(job, "swap", 0.0)
        if not self.lock.renew(job.token):  # another replica may be reindexing: only the holder swaps
            raise RuntimeError("lost the reindex lock before the swap; the built version was not served")
        fresh = self.runtime.serve_version(manifest.version)
        self.candidates.replace(merged)  # only now: the new version is built and valid
        self.runtime.store.set_current(manifest.version)
        self.runtime.swap(fresh, f"reindex job {job.id}")
        self.publish(manifest.version)
        prune(self.runtime, keep=KEEP_VERSIONS)

    def rollback(self) -> tuple[str, str]:
        """Serve the version before the current one. Returns (from, to)."""
        token = f"rollback-{os.getpid()}"
        if not self.lock.acquire(token):
            raise Busy(f"reindex job {self.lock.holder()} is running")
        try:
            serving = self.runtime.current()
            target = previous_version(self.runtime, serving)
            if target is None:
                raise LookupError("no earlier index version built with this model")
            fresh = self.runtime.serve_version(target)
            # The store goes back with the index: the next upload builds on what is served.
            self.candidates.replace(self.runtime.store.records(target))
            self.runtime.store.set_current(target)
            self.runtime.swap(fresh, "rollback")
            self.publish(target)
            return serving.index_version, target
        finally:
            self.lock.release(token)


def _return_freed_memory() -> None:
    """A build allocates and frees hundreds of MB (vectors, graphs, the records). glibc keeps
    freed heap for reuse, so without this the process stays that much larger after every
    reindex. malloc_trim hands it back to the OS."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to trim
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def same_model_versions(runtime: Runtime, serving: Serving) -> list[str]:
    store = runtime.store
    return [v for v in store.versions() if store.manifest(v).bundle_checksum == serving.bundle.checksum]


def previous_version(runtime: Runtime, serving: Serving) -> str | None:
    older = [v for v in same_model_versions(runtime, serving) if v < serving.index_version]
    return older[-1] if older else None


def prune(runtime: Runtime, keep: int) -> None:
    """Deletes all but this model's newest `keep` versions, never the serving one.
    Other models' versions are left alone: they are another bundle's index."""
    serving = runtime.current()
    for version in same_model_versions(runtime, serving)[:-keep]:
        if version != serving.index_version:
            shutil.rmtree(runtime.store.path(version), ignore_errors=True)
