"""The strategy walk: thresholds, fall-through, exclusions, lazy encoding."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from app.config import Settings
from app.engine import pipeline
from app.engine.pipeline import ReplyOptions
from app.engine.retriever import Strategy
from app.engine.runtime import Runtime, build_runtime

pytestmark = pytest.mark.anyio

BOTH: list[Strategy] = ["query_similarity", "reply_matching"]


@pytest.fixture
def runtime(artifacts: Path) -> Runtime:
    runtime = build_runtime(Settings(artifacts_dir=artifacts))
    assert runtime.serving is not None
    return runtime


def with_query_threshold(runtime: Runtime, threshold: float) -> Runtime:
    serving = runtime.current()
    bundle = replace(serving.bundle, thresholds=replace(serving.bundle.thresholds, query_similarity=threshold))
    runtime.serving = replace(serving, bundle=bundle)
    return runtime


async def test_confident_query_similarity_answers_without_encoding_the_context(runtime: Runtime) -> None:
    outcome = await pipeline.reply(runtime, ["do you like dogs?", "my cat is sick"], ReplyOptions(3, BOTH), set())
    assert outcome.answer.best.source == "query_similarity"
    assert outcome.answer.best.text == "oh no, i hope she gets better soon"
    assert runtime.cache.misses == 1  # the last turn only; the joined context was never needed


async def test_unsure_query_similarity_falls_through_to_reply_matching(runtime: Runtime) -> None:
    with_query_threshold(runtime, 1.01)  # above any cosine
    outcome = await pipeline.reply(runtime, ["my cat is sick"], ReplyOptions(3, BOTH), set())
    assert outcome.answer.best.source == "reply_matching"
    assert all(c.source == "reply_matching" for c in outcome.answer.candidates)


async def test_when_no_strategy_is_confident_the_last_one_tried_answers(runtime: Runtime) -> None:
    with_query_threshold(runtime, 1.01)
    outcome = await pipeline.reply(runtime, ["my cat is sick"], ReplyOptions(3, ["query_similarity"]), set())
    assert outcome.answer.best.source == "query_similarity"


async def test_excluded_replies_are_never_returned(runtime: Runtime) -> None:
    banned = "oh no, i hope she gets better soon"
    outcome = await pipeline.reply(runtime, ["my cat is sick"], ReplyOptions(50, BOTH), {banned})
    assert banned not in [c.text for c in outcome.answer.candidates]
