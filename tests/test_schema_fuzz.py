"""Schemathesis against the app's own OpenAPI schema, in process: every check,
the admin token supplied. Bounded to about a minute; `make chaos` runs longer."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from app.main import create_app
from tests.helpers import settings_for

TOKEN = "fuzz-token"
EXAMPLES = 30  # per operation and phase; about a minute on two cores


def ready_first(app: Any) -> Callable[..., Any]:
    """The app serves /readyz while it loads; the fuzzer should meet the loaded app."""

    async def wrapped(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            for _ in range(3000):
                if app.state.service.runtime is not None:
                    break
                await asyncio.sleep(0.01)
        await app(scope, receive, send)

    return wrapped


@pytest.fixture(scope="module")
def api_schema(poly_artifacts: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    own = tmp_path_factory.mktemp("fuzz") / "artifacts"
    # A bundle with a poly head and reactions, as the release has: every option can be honoured.
    shutil.copytree(poly_artifacts, own)  # uploads the fuzzer makes land in a copy
    app = create_app(settings_for(own, admin_token=TOKEN, access_log=False))
    return schemathesis.openapi.from_asgi("/openapi.json", ready_first(app))


def test_every_operation_answers_as_its_schema_says(api_schema: Any) -> None:
    # Driven by hand rather than by schemathesis' pytest plugin, whose lazy
    # fixture loading reads a private pytest attribute that pytest 9 removed.
    failures: dict[str, str] = {}
    operations = [result.ok() for result in api_schema.get_all_operations()]
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
        def check(case: Any) -> None:
            case.call_and_validate(headers={"Authorization": f"Bearer {TOKEN}"})

        try:
            check()
        except Exception as error:  # every operation runs; all failures are reported together
            failures[operation.label] = f"{type(error).__name__}: {error}"[:2000]
    assert len(operations) >= 8
    assert failures == {}
