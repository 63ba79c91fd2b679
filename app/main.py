"""create_app(): the FastAPI application. Heavy loading happens in the lifespan."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio.to_thread
from fastapi import FastAPI

from app import errors
from app.admin import build_admin
from app.config import Settings, get_settings
from app.engine import replicas
from app.engine.runtime import build_runtime
from app.limits import BodySizeLimit
from app.routes import admin, health, reply, similar


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        # Loading an index takes seconds; keep the loop free for /healthz meanwhile.
        runtime = await anyio.to_thread.run_sync(build_runtime, settings)
        app.state.runtime = runtime
        app.state.admin = await anyio.to_thread.run_sync(build_admin, settings, runtime)
        listener = None
        if settings.redis_url:
            listener = asyncio.create_task(replicas.listen(runtime, settings.redis_url, app.state.admin.origin))
        try:
            yield
        finally:
            if listener is not None:
                listener.cancel()
                await asyncio.wait({listener}, timeout=3)  # shutdown must not hang on Redis
            app.state.admin.close()
            await runtime.close()

    app = FastAPI(title="chit-chat reply retrieval", version="0.1.0", lifespan=lifespan)
    errors.install(app)

    app.include_router(reply.router)
    app.include_router(similar.router)
    app.include_router(health.router)
    app.include_router(admin.router)
    app.add_middleware(
        BodySizeLimit,
        max_bytes=settings.max_body_bytes,
        per_path={"/admin/candidates": settings.admin_max_body_bytes},
    )
    return app
