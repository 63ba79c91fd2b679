"""Zero-downtime reindex jobs: build off to the side, validate, swap, tell the replicas.

A job runs in a background thread at lower CPU priority (`priority.BACKGROUND`, inherited
by its encoder's threads), so live requests keep most of the machine. Nothing is written to the
candidate store or the current-version pointer until the new version has been
built and validated; a failed job changes nothing that serves.

The swap is the job's last step that can fail it. Telling the other replicas
and pruning old versions come after; their failures are reported in the job
(`report["after_swap"]`) and do not fail it: the new version serves, and the
other replicas find it at the pointer within seconds (`replicas.Follower`).

The lock (`claim`) and the steps after a swap (`after_swap`) are shared with
`rollback.py`; which versions exist and which are pruned is `versions.py`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from app.engine.memory import return_freed_memory
from app.engine.priority import BACKGROUND, lower_this_thread
from app.engine.runtime import Runtime
from app.engine.sets import CandidateSet
from app.engine.stats import Buckets
from app.reindex.budget import BuildBudget
from app.reindex.jobs import Job, JobStore, Lock, Renewer, fail_dead
from app.reindex.versions import prune
from core.records import Candidate
from index.build import build_version
from index.candidates import CandidateStore, apply, duplicates
from index.encode_cache import EncodeCache

log = logging.getLogger(__name__)

# A job's final state is retried this long: unsaved, the job would read as running,
# then as interrupted, whatever really happened.
FINAL_SAVE_S = 120


REINDEX_SECONDS = (5, 15, 30, 60, 120, 300, 600)  # the buckets of a job's duration


@dataclass(frozen=True)
class _Work:
    """What a job was submitted with (`Reindexer.submit`): the uploaded records, each one's line in
    the upload (for the duplicates report), whether the job is still wanted, the encoder asked for
    and what the candidates came from (the version's `source`)."""

    upload: list[Candidate]
    lines: list[int] | None = None
    still_wanted: Callable[[], bool] | None = None
    encoder: str | None = None
    source: str | None = None


class Busy(Exception):
    """Another reindex or rollback holds the lock."""


class Superseded(Exception):
    """What a job was submitted for has stopped holding (`submit`'s `still_wanted`): nothing was served."""


class Reindexer:
    """One set's reindex jobs: its candidate store, jobs and lock. Sets never wait on each other's."""

    def __init__(
        self,
        runtime: Runtime,
        candidate_set: CandidateSet,
        candidates: CandidateStore,
        jobs: JobStore,
        lock: Lock,
        publish: Callable[[str], None],
        outcomes: dict[str, int] | None = None,
        durations: Buckets | None = None,
        builds: BuildBudget | None = None,
    ) -> None:
        self.runtime = runtime
        self.candidate_set = candidate_set
        self.candidates = candidates
        self.jobs = jobs
        self.lock = lock
        self.publish = publish
        # For /metrics, shared by every set's reindexer when given: "succeeded"/"failed" -> jobs,
        # and seconds from submit to done.
        self.outcomes: dict[str, int] = {} if outcomes is None else outcomes
        self.durations = durations or Buckets(REINDEX_SECONDS)
        # Every set's index builds share it when given: a process-wide memory bound (`budget.py`).
        self.builds = builds or BuildBudget(1 << 30)

    def submit(
        self,
        mode: str,
        upload: list[Candidate],
        report: dict[str, Any] | None = None,
        encoder: str | None = None,
        still_wanted: Callable[[], bool] | None = None,
        reserved: int = 0,
        source: str | None = None,
        lines: list[int] | None = None,
    ) -> Job:
        """encoder: the shipped bundle to build with (checked by the caller, `Runtime.model_by_name`);
        None keeps the set's own, or the default for a new set. Another encoder than the set's
        re-encodes every record; the version before serves until the swap.

        still_wanted: asked under the lock as the job starts and again right before it swaps; False
        fails the job (`Superseded`) with nothing served. What it reads (the pointer) only the lock's
        holder changes, so no upload or rollback can land between its answer and the swap.

        reserved: the candidates the set may hold once the job ends, counted against the limit over
        every set while it runs (`Admin.admit`).

        source: what the candidates came from, as the version records it; None: "admin:<mode>".
        lines: each uploaded record's line, for the duplicates the job reports.

        report: what the job reports from the start (the upload's skipped records); the encoder and
        the source are reported with it."""
        job = Job.new(mode)
        job.counts = {"uploaded": len(upload), **({"reserved": reserved} if reserved else {})}
        job.report = dict(report or {})
        if encoder is not None:
            job.report["encoder"] = encoder
        if source is not None:
            job.report["source"] = source
        holding = self.claim(job.token)
        try:
            self.jobs.save(job)
            threading.Thread(
                target=self._run,
                args=(job, holding, _Work(upload, lines, still_wanted, encoder, source)),
                name=f"reindex-{job.id}",
                daemon=True,
            ).start()
        except BaseException:
            holding.release()
            raise
        return job

    def claim(self, token: str) -> Renewer:
        """The lock, held and renewed, or Busy. Whatever job was active before is now known dead."""
        holding = Renewer(self.lock, token)
        if not holding.acquire():
            raise Busy(f"reindex job {self.lock.holder()} is running")
        try:
            for job_id in fail_dead(self.jobs, self.lock):
                log.warning("reindex job %s was interrupted (its process is gone); marked failed", job_id)
        except Exception:  # the sweep is housekeeping: a Redis blip must not refuse the upload
            log.warning("could not check for interrupted jobs", exc_info=True)
        return holding

    def _run(self, job: Job, holding: Renewer, work: _Work) -> None:
        lower_this_thread(BACKGROUND)
        try:
            job.state = "running"
            self._build_and_swap(job, holding, work)
            job.state, job.stage, job.progress = "succeeded", "done", 1.0
            log.info("reindex %s: now serving %s", job.id, job.version)
        except Exception as error:
            log.exception("reindex %s failed", job.id)
            job.state, job.error = "failed", f"{type(error).__name__}: {error}"
        finally:
            self.outcomes[job.state] = self.outcomes.get(job.state, 0) + 1
            self.durations.observe(time.time() - job.created_at)
            # Released before the final state is saved: once a client sees
            # the job finished, its next upload must not get 409.
            holding.release()
            self._save_final(job)
            return_freed_memory()

    def _save_final(self, job: Job) -> None:
        deadline = time.monotonic() + FINAL_SAVE_S
        while True:
            try:
                self.jobs.save(job)
                return
            except Exception:
                if time.monotonic() > deadline:
                    log.exception("reindex %s ended %s, but that could not be saved", job.id, job.state)
                    return
                time.sleep(1)

    def _progress(self, job: Job, stage: str, fraction: float) -> None:
        job.stage, job.progress = stage, round(fraction, 3)
        self.jobs.save(job)

    def _build_and_swap(self, job: Job, holding: Renewer, work: _Work) -> None:
        def check_wanted() -> None:
            if work.still_wanted is not None and not work.still_wanted():
                raise Superseded("the set moved on (an upload or a rollback came first); nothing was served")

        check_wanted()
        target = self.candidate_set
        model = self.runtime.model_to_build(target, work.encoder)
        job.report["encoder"] = model.bundle_dir.name
        serving = target.serving  # None until the first version exists: this job may build it
        job.previous_version = serving.index_version if serving else None
        self._progress(job, "load", 0.0)
        current = self.records_now()
        merged = apply(current, job.mode, work.upload)
        if job.mode != "delete":  # only here are the stored records known: the upload alone cannot tell
            job.report["duplicates"] = duplicates(current, job.mode, work.upload, merged, work.lines)
        job.counts.update(candidates_before=len(current), candidates_after=len(merged))
        if not merged:
            raise ValueError("the upload would leave no candidates")

        # Every set's builds share one memory budget in this process: this one may wait its turn.
        with self.builds.held(len(merged), waiting=lambda: self._progress(job, "waiting for a build", 0.0)):
            # Its own session, created in this low-priority thread: its worker
            # threads inherit the niceness, so on an idle machine the build uses
            # every core and under load the scheduler favours live requests.
            encoder = model.encoder.sibling(self.runtime.settings.ort_intra_op_threads)
            manifest = build_version(
                merged,
                encoder,
                model.bundle.checksum,
                target.store,
                source=f"admin:{job.mode}" if work.source is None else work.source,
                progress=False,
                on_progress=lambda stage, fraction: self._progress(job, stage, fraction),
                # A job killed halfway and submitted again encodes only the chunks it had not finished.
                cache=EncodeCache(self.runtime.settings.artifacts_dir / "cache" / "encode", model.bundle.checksum),
                valence=model.reactions.valence if model.reactions is not None else None,
            )
        job.version = manifest.version
        job.counts.update(replies=manifest.replies, queries=manifest.queries, encoded=manifest.encoded)

        self._progress(job, "swap", 0.0)
        fresh = self.runtime.load_version(target, manifest.version)  # seconds on a large set
        # Asked after the load, as a rollback does: the lock may have gone while it loaded, and
        # another replica may be reindexing. Only the holder swaps.
        if not holding.still_held():
            raise RuntimeError("lost the reindex lock before the swap; the built version was not served")
        check_wanted()
        # The pointer first: it is the one truth. A failure here fails the job with the store untouched.
        target.point_to(fresh, f"reindex job {job.id}")
        job.report["after_swap"] = self.after_swap(manifest.version, merged)

    def records_now(self) -> list[Candidate]:
        """The set's records as the version its pointer names holds them: the store's when it says it is
        that version, else the version's own (a store that lags or leads the pointer: a write that
        failed, a process that died between the two)."""
        pointer = self.candidate_set.store.current()
        if pointer is None:
            return []
        if self.candidates.version() == pointer:
            return self.candidates.all()
        return self.candidate_set.store.records(pointer)

    def after_swap(self, version: str, records: list[Candidate]) -> dict[str, str]:
        """Stores the records the new version is, tells the other replicas, and prunes. Each step's
        outcome, for the job's report: the version serves either way, the store catches up at the next
        job (`records_now`), and the replicas also find the version at the pointer."""
        steps: dict[str, Callable[[], None]] = {
            "store": lambda: self.candidates.replace(records, version),
            "publish": lambda: self.publish(version),
            "prune": lambda: prune(self.candidate_set),
        }
        outcome = {}
        for step, run in steps.items():
            try:
                run()
                outcome[step] = "done"
            except Exception as error:
                log.warning("after the swap to %s, %s failed: %s", version, step, error)
                outcome[step] = f"failed: {type(error).__name__}: {error}"
        return outcome
