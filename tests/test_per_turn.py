"""The per-turn way (core/context.py): each turn encoded once, its vector kept with the session's turn
and in the cache, and one bundle's vectors never meeting another's."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import redis

from app.engine import pipeline
from app.engine.pipeline import ReplyOptions
from app.engine.runtime import Runtime, build_runtime
from app.engine.sessions import SessionTurn, TurnVector, decode, encode, space_of
from core.bundle import read_manifest
from core.context import Combiner, unit
from core.retriever import Strategy
from tests.helpers import REDIS_URL, bundle_of, closed_port, settings_for

pytestmark = pytest.mark.anyio

MATCHING: list[Strategy] = ["reply_matching"]
CONVERSATION = ["hi! how are you?", "do you like dogs?", "what do you do for fun?", "good night"]


def runtime_on(artifacts: Path, **settings: object) -> Runtime:
    runtime = build_runtime(settings_for(artifacts, **settings))
    assert runtime.default.serving is not None
    return runtime


async def play(runtime: Runtime, session: str, messages: list[str]) -> list[int]:
    """Each message in turn through the session; the cache misses each request cost."""
    misses = []
    for message in messages:
        before = runtime.cache.misses
        await pipeline.session_reply(runtime, session, message, ReplyOptions(3, MATCHING))
        misses.append(runtime.cache.misses - before)
    return misses


def test_a_combiner_of_one_turn_with_no_head_gives_the_turn_itself() -> None:
    v = unit(np.random.default_rng(0).normal(size=(1, 1, 8)).astype(np.float32))  # [1, 1, D]
    plain = Combiner(
        np.zeros(3, np.float32),
        np.zeros(3, np.float32),
        np.zeros(3, np.float32),
        np.zeros((8, 8), np.float32),
        np.zeros(8, np.float32),
        np.array([False, True, False]),
    )
    padded = np.concatenate([v, np.zeros((1, 2, 8), np.float32)], axis=1)  # [1, N, D]: one turn of three
    assert np.allclose(plain.combine_many(padded, [["hi"]]), v[:, 0])
    two = unit(np.random.default_rng(1).normal(size=(2, 8)).astype(np.float32))  # oldest first
    assert np.allclose(plain.combine(two, ["a", "b"]), unit(two.sum(axis=0)))  # every gate e^0: a plain sum
    assert plain.sides(3) == ["context", "reply", "context"]  # oldest first: the newest is the user's
    assert plain.sides(2) == ["reply", "context"]
    with pytest.raises(ValueError, match="context side"):
        Combiner(
            *[getattr(plain, f) for f in ("gate_bias", "gate_newest", "gate_own", "head", "head_bias")],
            reply_side=np.array([True, False, False]),
        ).check()


def test_a_turn_vector_packs_into_a_fifth_of_its_float_bytes_and_reads_back() -> None:
    vector = unit(np.random.default_rng(1).normal(size=384).astype(np.float32))
    packed = TurnVector(vector, "abc:context").pack()
    assert len(packed) <= 520
    back = TurnVector.unpack(packed, "abc:context")
    assert back is not None and float(back.vector @ vector) > 0.9999
    turn = decode(encode(SessionTurn("user", "hi", TurnVector(vector, "abc:context"))))
    assert turn is not None and turn.vector_in("abc:context") is not None
    assert turn.vector_in("abc:reply") is None and turn.vector_in("other:context") is None
    corrupt = json.dumps({"role": "user", "text": "hi", "v": "%%%", "s": "abc:context"}).encode()
    assert decode(corrupt) == SessionTurn("user", "hi")  # the turn stays; its vector is made again


async def test_a_session_encodes_only_its_new_message(per_turn_artifacts: Path) -> None:
    """The user's turns keep their vectors in the session, and the bot's come from the index: after
    the first, every request looks up and encodes one text, its new message."""
    runtime = runtime_on(per_turn_artifacts)
    assert runtime.current().combiner is not None
    assert await play(runtime, "s1", CONVERSATION) == [1, 1, 1, 1]
    history = await runtime.sessions.history("s1")
    checksum = runtime.current().bundle.checksum
    assert all(t.vector is not None for t in history.turns)  # every answer here is a stored reply
    assert {t.vector.space for t in history.turns if t.vector and t.role == "bot"} == {space_of(checksum, "reply")}


async def test_the_context_vector_a_session_serves_is_the_one_offline_code_computes(per_turn_artifacts: Path) -> None:
    """Calibration and the bake-off make context vectors with `Encoder.contexts`; the service, from the
    kept vectors. They must agree, or what was fitted is not what serves."""
    runtime = runtime_on(per_turn_artifacts)
    await play(runtime, "s2", CONVERSATION[:2])
    history = await runtime.sessions.history("s2")
    turns = [t.text for t in history.turns] + ["what do you do for fun?"]
    served = await pipeline.reply(runtime, turns, ReplyOptions(5, MATCHING), set(), history.turns)
    offline = runtime.current().encoder.contexts([turns])[0]  # [D]
    stateless = await pipeline.reply(runtime, turns, ReplyOptions(5, MATCHING), set())
    assert [c.text for c in served.answer.candidates] == [c.text for c in stateless.answer.candidates]
    scores = [c.score for c in served.answer.candidates]
    replies = runtime.current().encoder.encode([c.text for c in served.answer.candidates], "reply")
    assert np.allclose(scores, replies @ offline, atol=0.03)  # 8-bit codes, and the bot's vector from them


async def test_a_stateless_caller_sending_the_growing_context_encodes_only_what_is_new(
    per_turn_artifacts: Path,
) -> None:
    runtime = runtime_on(per_turn_artifacts)
    context: list[str] = []
    misses = []
    for message in CONVERSATION:
        context.append(message)
        before = runtime.cache.misses
        outcome = await pipeline.reply(runtime, context, ReplyOptions(3, MATCHING), set())
        misses.append(runtime.cache.misses - before)
        context.append(outcome.answer.best.text)  # what a client keeps of the answer
    assert misses == [1, 1, 1, 1]  # its earlier turns hit the cache, the bot's put there when answered


async def test_joined_context_serves_a_combiner_bundle_the_joined_way(per_turn_artifacts: Path) -> None:
    runtime = runtime_on(per_turn_artifacts, joined_context=True)
    serving = runtime.current()
    assert serving.combiner is None
    bundle = read_manifest(bundle_of(per_turn_artifacts))
    assert bundle.joined is None or serving.thresholds == bundle.joined.thresholds
    context = ["hi! how are you?", "i'm good thanks, how about you?", "do you like dogs?"]
    outcome = await pipeline.reply(runtime, context, ReplyOptions(3, MATCHING), set())
    joined = serving.encoder.contexts([context], joined=True)[0]
    top = serving.encoder.encode([outcome.answer.best.text], "reply")[0]
    assert abs(outcome.answer.best.score - float(top @ joined)) < 0.03
    assert outcome.message_vector is None  # nothing kept: the next request encodes the window again


async def test_a_kept_vector_of_another_bundle_is_made_again(
    per_turn_artifacts: Path, clean_redis: redis.Redis
) -> None:
    """A session stored by a replica on another bundle (a swap, a rollback, an older replica): its
    vectors name that bundle's space, so they are encoded again, never read as this one's."""
    runtime = runtime_on(per_turn_artifacts, redis_url=REDIS_URL)
    foreign = TurnVector(unit(np.ones(32, np.float32)), space_of("f" * 64, "context"))
    stale = [encode(SessionTurn("user", "do you like dogs?", foreign)), encode(SessionTurn("bot", "lol"))]
    clean_redis.rpush("session:s-old", *stale)
    clean_redis.set("writes:session:s-old", 1)
    assert await play(runtime, "s-old", ["good night"]) == [3]  # all three turns of the window
    torn = TurnVector(unit(np.ones(7, np.float32)), space_of(runtime.current().bundle.checksum, "context"))
    clean_redis.rpush(
        "session:s-torn", encode(SessionTurn("user", "where are you from?", torn)), encode(SessionTurn("bot", "no way"))
    )
    clean_redis.set("writes:session:s-torn", 1)
    assert await play(runtime, "s-torn", ["are you a student?"]) == [3]  # its space, not its size: encoded again
    fresh = runtime_on(per_turn_artifacts)
    same = await pipeline.reply(fresh, ["do you like dogs?", "lol", "good night"], ReplyOptions(3, MATCHING), set())
    history = await runtime.sessions.history("s-old")
    assert history.turns[-1].text == same.answer.best.text  # the answer a clean start gives


async def test_a_session_keeps_its_turns_and_vectors_across_replicas(
    per_turn_artifacts: Path, clean_redis: redis.Redis
) -> None:
    one = runtime_on(per_turn_artifacts, redis_url=REDIS_URL)
    two = runtime_on(per_turn_artifacts, redis_url=REDIS_URL)
    assert await play(one, "s-switch", CONVERSATION[:2]) == [1, 1]
    assert await play(two, "s-switch", CONVERSATION[2:]) == [1, 1]  # the other replica reads what one kept
    history = await two.sessions.history("s-switch")
    assert [t.text for t in history.turns if t.role == "user"] == CONVERSATION


async def test_with_redis_down_a_missing_vector_is_encoded_not_guessed(per_turn_artifacts: Path) -> None:
    down = runtime_on(per_turn_artifacts, redis_url=f"redis://127.0.0.1:{closed_port()}/0")
    up = runtime_on(per_turn_artifacts)
    context = ["hi! how are you?", "i'm good thanks, how about you?", "do you like dogs?"]
    a = await pipeline.reply(down, context, ReplyOptions(5, MATCHING), set())
    b = await pipeline.reply(up, context, ReplyOptions(5, MATCHING), set())
    assert [c.text for c in a.answer.candidates] == [c.text for c in b.answer.candidates]
    assert [round(c.score, 4) for c in a.answer.candidates] == [round(c.score, 4) for c in b.answer.candidates]


async def test_the_session_byte_bound_counts_the_kept_vectors(per_turn_artifacts: Path) -> None:
    runtime = runtime_on(per_turn_artifacts, session_max_bytes=12_288)
    await play(runtime, "s-bytes", [f"message number {i} about dogs and hiking" for i in range(12)])
    raws = (await runtime.sessions.backend.read("session:s-bytes"))[0]
    assert sum(len(r) for r in raws) <= 12_288
    assert all(b'"v":' in r for r in raws)


async def test_a_window_shorter_than_the_combiner_is_combined_as_offline_code_combines_it(
    per_turn_artifacts: Path,
) -> None:
    runtime = runtime_on(per_turn_artifacts)
    turns = ["i'm good thanks, how about you?", "do you like dogs?"]  # 2 of the combiner's 3 positions
    served = await pipeline.reply(runtime, turns, ReplyOptions(3, MATCHING), set())
    offline = runtime.current().encoder.contexts([turns])[0]  # [D]
    top = runtime.current().encoder.encode([served.answer.best.text], "reply")[0]
    assert abs(served.answer.best.score - float(top @ offline)) < 0.03
