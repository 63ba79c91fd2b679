"""The strategy walk: thresholds, fall-through, exclusions, lazy encoding."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest

from app.engine import pipeline
from app.engine.pipeline import ReplyOptions
from app.engine.runtime import Runtime, build_runtime
from core.retriever import Strategy
from tests.helpers import settings_for

pytestmark = pytest.mark.anyio

BOTH: list[Strategy] = ["query_similarity", "reply_matching"]


@pytest.fixture
def runtime(artifacts: Path) -> Runtime:
    runtime = build_runtime(settings_for(artifacts))
    assert runtime.default.serving is not None
    return runtime


def with_query_threshold(runtime: Runtime, threshold: float) -> Runtime:
    serving = runtime.current()
    runtime.default.serving = replace(serving, thresholds=replace(serving.thresholds, query_similarity=threshold))
    return runtime


async def test_confident_query_similarity_answers_from_one_encoder_pass(runtime: Runtime) -> None:
    outcome = await pipeline.reply(runtime, ["do you like dogs?", "my cat is sick"], ReplyOptions(3, BOTH), set())
    assert outcome.answer.best.source == "query_similarity"
    assert outcome.answer.best.text == "oh no, i hope she gets better soon"
    # The last turn and the joined context went to the encoder together, as one job.
    assert runtime.encoder_queue.stats.batches == 1 and runtime.encoder_queue.stats.items == 1
    assert runtime.cache.misses == 2


async def test_a_repeated_context_is_served_from_the_cache(runtime: Runtime) -> None:
    for _ in range(3):
        await pipeline.reply(runtime, ["do you like dogs?", "my cat is sick"], ReplyOptions(3, BOTH), set())
    assert runtime.encoder_queue.stats.batches == 1


async def test_unsure_query_similarity_falls_through_to_reply_matching(runtime: Runtime) -> None:
    with_query_threshold(runtime, 1.01)  # above any cosine
    outcome = await pipeline.reply(runtime, ["my cat is sick"], ReplyOptions(3, BOTH), set())
    assert outcome.answer.best.source == "reply_matching"
    assert all(c.source == "reply_matching" for c in outcome.answer.candidates)


async def test_a_stored_query_typed_again_scores_one_despite_the_8_bit_codes(runtime: Runtime) -> None:
    # A calibrated threshold can sit near 1, above what a stored query's own
    # vector scores through the quantised index.
    with_query_threshold(runtime, 0.9999)
    outcome = await pipeline.reply(runtime, ["hi", "My  cat is SICK"], ReplyOptions(3, BOTH), set())
    assert outcome.answer.best.source == "query_similarity"
    assert outcome.answer.best.score == 1.0
    assert outcome.answer.best.text == "oh no, i hope she gets better soon"
    reworded = await pipeline.reply(runtime, ["hi", "my cat is sick, sadly"], ReplyOptions(3, BOTH), set())
    assert reworded.answer.best.source == "reply_matching"


async def test_a_last_turn_is_compared_with_stored_queries_as_they_were_encoded(prefixed_artifacts: Path) -> None:
    """A build encodes each stored query once, as a stored turn (the reply side, "passage: " for
    e5): the last turn must be encoded the same way, or a near copy scores as another text."""
    runtime = build_runtime(settings_for(prefixed_artifacts))
    serving = runtime.current()
    assert serving.index.manifest.query_side == "reply"
    near = "My cat is sick!!"  # not the stored "my cat is sick" once normalised: scored through its vector
    matches, _ = await pipeline.similar_queries(runtime, near, 1)
    assert matches[0][0] == "my cat is sick"
    stored, said = serving.encoder.encode(["my cat is sick", near], "reply")  # [D] each
    as_context = serving.encoder.encode([near], "context")[0]  # [D]
    assert abs(matches[0][2] - float(stored @ said)) < 0.01  # 8-bit codes
    assert abs(float(stored @ said) - float(stored @ as_context)) > 0.02  # the check can tell the sides apart


async def test_a_near_copy_whose_reply_echoes_the_user_lets_reply_matching_answer(runtime: Runtime) -> None:
    # The stored query matches exactly, but its reply is the user's own earlier turn: the look
    # goes on to the next hit, which scores under the threshold and so cannot answer either.
    with_query_threshold(runtime, 0.9999)
    echo = "oh no, i hope she gets better soon"
    outcome = await pipeline.reply(runtime, [echo, "my cat is sick"], ReplyOptions(3, BOTH), set())
    assert outcome.answer.best.source == "reply_matching"
    assert echo not in [c.text for c in outcome.answer.candidates]


async def test_a_last_turn_no_stored_query_equals_is_not_encoded(artifacts: Path) -> None:
    # With the threshold at -1 any stored query would answer, if its vector were looked up:
    # at the bundle's threshold, query similarity answers only on a copy of a stored query.
    context = ["hi", "my cat is sick, sadly"]
    gated = with_query_threshold(build_runtime(settings_for(artifacts)), -1.0)
    outcome = await pipeline.reply(gated, context, ReplyOptions(3, BOTH), set())
    assert outcome.answer.best.source == "reply_matching"
    assert gated.cache.misses == 1  # the context alone went to the encoder
    ungated = with_query_threshold(build_runtime(settings_for(artifacts, query_similarity_exact_only=False)), -1.0)
    outcome = await pipeline.reply(ungated, context, ReplyOptions(3, BOTH), set())
    assert outcome.answer.best.source == "query_similarity" and ungated.cache.misses == 2
    # A request's own threshold asks for near copies too, so its last turn is encoded.
    asked = ReplyOptions(3, BOTH, thresholds={"query_similarity": -1.0})
    outcome = await pipeline.reply(gated, context, asked, set())
    assert outcome.answer.best.source == "query_similarity"


async def test_a_threshold_no_copy_can_reach_encodes_no_last_turn(runtime: Runtime) -> None:
    # The release's calibration set 1.01: a stored query typed again scores 1.0, so query
    # similarity cannot answer and its vector would be encoded for nothing.
    with_query_threshold(runtime, 1.01)
    outcome = await pipeline.reply(runtime, ["hi", "my cat is sick"], ReplyOptions(3, BOTH), set())
    assert outcome.answer.best.source == "reply_matching"
    assert runtime.cache.misses == 1  # the joined context alone, though the last turn is a stored query
    # A request that sets its own threshold still gets query similarity.
    asked = ReplyOptions(3, BOTH, thresholds={"query_similarity": 0.9})
    outcome = await pipeline.reply(runtime, ["hi", "my cat is sick"], asked, set())
    assert outcome.answer.best.source == "query_similarity" and runtime.cache.misses == 2


async def test_when_no_strategy_is_confident_the_last_one_tried_answers(runtime: Runtime) -> None:
    with_query_threshold(runtime, 1.01)
    outcome = await pipeline.reply(runtime, ["my cat is sick"], ReplyOptions(3, ["query_similarity"]), set())
    assert outcome.answer.best.source == "query_similarity"


async def test_excluded_replies_are_never_returned(runtime: Runtime) -> None:
    banned = "oh no, i hope she gets better soon"
    outcome = await pipeline.reply(runtime, ["my cat is sick"], ReplyOptions(50, BOTH), {banned})
    assert banned not in [c.text for c in outcome.answer.candidates]


async def test_concurrent_messages_of_one_session_are_answered_and_stored_in_order(runtime: Runtime) -> None:
    messages = [f"message {i}: do you like dogs?" for i in range(8)]
    tasks = []
    for message in messages:  # arrival order is creation order
        tasks.append(asyncio.create_task(pipeline.session_reply(runtime, "s-order", message, ReplyOptions(3, BOTH))))
        await asyncio.sleep(0)
    replies = [outcome.answer.best.text for outcome in await asyncio.gather(*tasks)]
    history = (await runtime.sessions.history("s-order")).turns
    assert [t.text for t in history if t.role == "user"] == messages[-5:]  # the store keeps the last 10 turns
    # Each reply was chosen knowing the ones before it: none repeats within the no-repeat window.
    no_repeat = runtime.settings.session_no_repeat
    assert all(len(set(replies[i : i + no_repeat])) == len(replies[i : i + no_repeat]) for i in range(len(replies)))


async def test_a_reply_whose_caller_left_is_not_stored(runtime: Runtime) -> None:
    async def gone() -> bool:
        return False

    await pipeline.session_reply(runtime, "s-gone", "good night", ReplyOptions(3, BOTH), still_wanted=gone)
    assert (await runtime.sessions.history("s-gone")).turns == []


@pytest.mark.anyio
async def test_searches_run_with_the_configured_faiss_threads_in_every_worker() -> None:
    """OpenMP's thread count is per thread: set once at startup, a worker would search with every core."""
    import faiss

    from app.engine.compute import ComputePool

    pool = ComputePool(max_pending=8, workers=2, faiss_threads=7)  # 7: no machine's default here
    seen = await asyncio.gather(*(pool.run(faiss.omp_get_max_threads) for _ in range(8)))
    assert set(seen) == {7}
