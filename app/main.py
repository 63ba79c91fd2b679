"""create_app(): the FastAPI application. Heavy loading happens in the lifespan."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio.to_thread
from fastapi import FastAPI

from app import errors
from app.config import Settings, get_settings
from app.engine.runtime import build_runtime
from app.limits import BodySizeLimit
from app.routes import health, reply, similar


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        # Loading an index takes seconds; keep the loop free for /healthz meanwhile.
        app.state.runtime = await anyio.to_thread.run_sync(build_runtime, settings)
        try:
            yield
        finally:
            await app.state.runtime.close()

    app = FastAPI(title="chit-chat reply retrieval", version="0.1.0", lifespan=lifespan)
    errors.install(app)

    app.include_router(reply.router)
    app.include_router(similar.router)
    app.include_router(health.router)
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes)
    return app
