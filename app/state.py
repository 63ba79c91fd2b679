"""What one app holds between requests: the one typed object at `app.state.service`.

create_app makes it; the lifespan fills it in as the bundle and the index load; routes reach it
through the dependencies in app/deps.py, and middleware is handed the parts it needs."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from fastapi import FastAPI

from app.engine.runtime import Runtime
from app.limits import Admission
from app.metrics import Metrics
from app.reindex.first_build import Progress
from app.reindex.set_admin import Admin


@dataclass
class ServiceState:
    admission: Admission  # the in-flight limit's counts, read by /metrics too
    metrics: Metrics = field(init=False)
    runtime: Runtime | None = None  # None until the bundle and the index are loaded: /readyz says 503
    admin: Admin | None = None  # the admin side of each set, wired with the runtime
    load_error: str | None = None  # why loading failed, for /readyz; None while it runs or once it is done
    draining: bool = False  # SIGTERM came, or the lifespan is ending: /readyz says 503
    first_build: Progress | None = None  # the full index built behind a first slice, while one is owed
    background: list[asyncio.Task[None]] = field(default_factory=list)  # the follower and its kin

    def __post_init__(self) -> None:
        self.metrics = Metrics(lambda: (self.runtime, self.admin), self.admission)

    def drain(self) -> None:
        """SIGTERM came, or the lifespan is ending: not ready from now on."""
        self.draining = True

    def starting(self) -> None:
        """As a lifespan starts: nothing loaded, nothing failed, not draining."""
        self.runtime = self.load_error = None
        self.draining = False


def service_state(app: FastAPI) -> ServiceState:
    service: ServiceState = app.state.service
    return service
