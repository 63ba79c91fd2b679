"""create_app(): the FastAPI application. Heavy loading happens in the lifespan."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from types import FrameType

import anyio.to_thread
from fastapi import FastAPI

from app import errors, logs
from app.config import Settings, get_settings
from app.engine import replicas
from app.engine.memory import fix_malloc_thresholds
from app.engine.runtime import build_runtime
from app.limits import AdminGate, Admission, AdmissionLimit, BodySizeLimit
from app.probes import ProbePacer
from app.reindex import first_build
from app.reindex.set_admin import build_admin
from app.routes import admin, demo, health, metrics, reply, similar
from app.schemas import BODY_LIMITS
from app.state import ServiceState
from app.upload_gate import UPLOAD_ROUTE, RefuseBeforeBody
from index.first_slice import owed

log = logging.getLogger(__name__)

# The routes whose work queues for the encoder, and so what admission control counts.
ENCODER_ROUTES = frozenset({"/reply", "/similar"})


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        logs.configure(settings.log_level)
        fix_malloc_thresholds()  # before the bundle and the index load: see its docstring
        service.starting()  # /readyz says 503 until the loader below is done
        loading = asyncio.create_task(_load(service, settings), name="load-bundle-and-index")
        loading.add_done_callback(lambda task: _load_done(service, task))
        restore = _on_sigterm(service.drain, settings.shutdown_delay_s)
        try:
            # Serving starts now: /healthz and /readyz answer while the bundle and index load.
            yield
        finally:
            service.drain()
            restore()
            loading.cancel()
            await asyncio.gather(loading, return_exceptions=True)
            background = list(service.background)
            for task in background:
                task.cancel()
            if background:
                await asyncio.wait(background, timeout=3)  # shutdown must not hang on Redis
            if service.admin is not None:
                service.admin.close()
            if service.runtime is not None:
                await service.runtime.close()

    app = FastAPI(title="chit-chat reply retrieval", version="0.1.0", lifespan=lifespan)
    errors.install(app)
    service = ServiceState(Admission(settings.max_in_flight))
    app.state.service = service

    app.include_router(reply.router)
    app.include_router(similar.router)
    app.include_router(health.router)
    app.include_router(metrics.router)
    app.include_router(admin.router)
    app.include_router(demo.router)
    app.mount("/static", demo.static_files, name="static")
    # Inside the body reader: a request counts against the in-flight limit once its body is in, so
    # slow bodies wait out their deadline without holding a slot.
    app.add_middleware(
        AdmissionLimit, admission=service.admission, paths=ENCODER_ROUTES, max_drain_bytes=max(BODY_LIMITS.values())
    )
    app.add_middleware(
        BodySizeLimit,
        max_bytes=settings.max_body_bytes,
        bulk_bytes=settings.admin_max_body_bytes,
        bulk_paths=UPLOAD_ROUTE,  # candidate uploads: the admin body limit, not the request one
        path_bytes=BODY_LIMITS,
        deadline_s=settings.body_read_timeout_s,
        max_reading=settings.max_bodies_reading,
    )
    # Outside the body reader: while every slot is taken, a request is refused before its body is
    # read, as a flood's are (the count above still decides once the body is in).
    app.add_middleware(
        AdmissionLimit,
        admission=service.admission,
        paths=ENCODER_ROUTES,
        max_drain_bytes=max(BODY_LIMITS.values()),
        counts=False,
        drain_deadline_s=settings.body_read_timeout_s,
    )
    # Between the token check and the body reader: an upload that names an unknown encoder, or whose
    # set is busy, is refused before a byte of its body is read.
    app.add_middleware(RefuseBeforeBody, service=service)
    # Outside the size limit, which reads the body: an admin body is read only with the token, a few at a time.
    app.add_middleware(AdminGate, token=settings.admin_token, max_bodies=settings.admin_max_bodies_in_flight)
    # Before anything else a probe would cost: a connection that probes again within a second waits its turn.
    app.add_middleware(ProbePacer, rate_per_s=settings.probe_rate_per_s, on_paced=service.metrics.probes_paced.inc)
    # Outermost: it logs and counts 408s, 413s and 429s too.
    app.add_middleware(
        logs.RequestLog,
        enabled=settings.access_log,
        observe=service.metrics.observe,
        static_routes=ENCODER_ROUTES,
    )
    return app


async def _load(service: ServiceState, settings: Settings) -> None:
    """Loads the bundle and the index (seconds) off the event loop, then the admin side."""
    runtime = await anyio.to_thread.run_sync(build_runtime, settings)
    try:
        admin = service.admin = await anyio.to_thread.run_sync(build_admin, settings, runtime)
    except BaseException:
        await runtime.close()  # never reaches the service state, so the lifespan would not close it
        raise
    service.runtime = runtime
    # What loading made lives about as long as the process: kept out of the cyclic collector's sight,
    # a full collection under a flood does not walk it (the in-flight-limit flood's refusals: docs/experiments.md).
    # Frozen objects are still freed by their reference counts (a swapped-out index); only a cycle
    # among them would stay, so the cycles loading left are collected first.
    gc.collect()
    gc.freeze()
    follower = replicas.Follower(runtime, settings.index_poll_s)
    service.background = [asyncio.create_task(follower.run(), name="follow-index-pointer")]
    if owed(settings.indexes_root) is not None:  # a first slice serves: build the rest behind it
        service.first_build = first_build.Progress()
        builder = first_build.complete(admin, service.first_build)
        service.background.append(asyncio.create_task(builder, name="first-build"))
    if settings.redis_url:
        listener = replicas.listen(follower, settings.redis_url, admin.origin)
        service.background.append(asyncio.create_task(listener, name="index-updates"))


def _load_done(service: ServiceState, task: asyncio.Task[None]) -> None:
    """Records a load that raised. Expected problems (no index yet, a bundle that
    does not match) are caught inside and reported by the runtime; anything
    else (a corrupt FAISS file, a bug) ends the task, and unobserved, the
    replica would say "loading" forever with nothing in the logs."""
    if task.cancelled() or task.exception() is None:
        return
    error = task.exception()
    log.error("loading the bundle and index failed; this replica will not become ready", exc_info=error)
    service.load_error = f"{type(error).__name__}: {error}"


def _on_sigterm(callback: Callable[[], None], delay_s: float = 0.0) -> Callable[[], None]:
    """Run `callback` when SIGTERM arrives, and the server's own handler
    (uvicorn's, which closes the listener and drains) `delay_s` later: until
    then requests are still served and /readyz says 503, so a load balancer
    stops sending before connections are refused. Returns the undo."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None  # signal handlers can only be set from the main thread
    previous = signal.getsignal(signal.SIGTERM)

    def handler(signum: int, frame: FrameType | None) -> None:
        callback()
        if not callable(previous):
            return
        if delay_s > 0:
            log.info("SIGTERM: not ready; the listener closes in %.1f s", delay_s)
            # uvicorn's handler only sets flags, so it may run on a timer thread.
            timer = threading.Timer(delay_s, previous, (signum, frame))
            timer.daemon = True  # an exit by another path need not wait for it
            timer.start()
        else:
            previous(signum, frame)

    signal.signal(signal.SIGTERM, handler)

    def restore() -> None:
        signal.signal(signal.SIGTERM, previous)

    return restore
