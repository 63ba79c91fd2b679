"""Every route declares the shape of its answer, and answers in it: the OpenAPI schema is what a
client can rely on, and the Python client parses with the same models (app/client/answers.py)."""

from __future__ import annotations

from typing import get_args

from app.client import answers
from app.engine.kv import Status
from core.retriever import Strategy


def test_the_published_values_are_the_servers() -> None:
    assert get_args(Strategy) == answers.STRATEGIES
    assert get_args(Status) == answers.REDIS_STATES
