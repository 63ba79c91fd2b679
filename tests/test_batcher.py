"""The encoder batcher: order, the wait and token bounds, cancellation, refusal when full."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from typing import Any

import pytest

from app.engine import batcher as batcher_module
from app.engine.batcher import Batcher, Closed, Overloaded, _Waiting

pytestmark = pytest.mark.anyio


class HeldWait:
    """The batcher's wait for company (its asyncio.sleep), under the test's control: it
    records how long the worker asked to wait, and returns when the test says the time
    has passed. No test here depends on how fast the machine is."""

    def __init__(self) -> None:
        self.asked: list[float] = []
        self.waiting = asyncio.Event()
        self._over = asyncio.Event()

    async def sleep(self, seconds: float) -> None:
        if seconds == 0:  # a loop turn between wake-ups (`_deliver`), not a wait for company
            await asyncio.sleep(0)
            return
        self.asked.append(seconds)
        self.waiting.set()
        await self._over.wait()
        self._over.clear()
        self.waiting.clear()

    def over(self) -> None:
        self._over.set()


class _AsyncioWith:
    """The asyncio module as the batcher sees it, with the held wait for its sleep."""

    def __init__(self, wait: HeldWait) -> None:
        self.sleep = wait.sleep

    def __getattr__(self, name: str) -> Any:
        return getattr(asyncio, name)


@pytest.fixture
def company(monkeypatch: pytest.MonkeyPatch) -> HeldWait:
    wait = HeldWait()
    monkeypatch.setattr(batcher_module, "asyncio", _AsyncioWith(wait))
    return wait


class Recorder:
    """A runner that records each batch and can be held at a gate."""

    def __init__(self, seconds: float = 0.0) -> None:
        self.batches: list[list[int]] = []
        self.seconds = seconds
        self.gate = threading.Event()
        self.gate.set()

    def __call__(self, items: Sequence[int]) -> list[int]:
        self.gate.wait(5)
        time.sleep(self.seconds)
        self.batches.append(list(items))
        return [i * 10 for i in items]


async def test_each_caller_gets_its_own_result_and_batches_are_oldest_first() -> None:
    run = Recorder(seconds=0.02)
    batcher: Batcher[int, int] = Batcher(run, max_cost=100, max_wait_s=0.0, max_pending=64)
    results = await asyncio.gather(*(batcher.submit(i, cost=1) for i in range(10)))
    assert results == [i * 10 for i in range(10)]
    assert [i for batch in run.batches for i in batch] == list(range(10))
    await batcher.close()


async def test_requests_that_come_while_the_first_waits_share_its_batch(company: HeldWait) -> None:
    run = Recorder()
    batcher: Batcher[int, int] = Batcher(run, max_cost=100, max_wait_s=0.2, max_pending=64)
    first = asyncio.create_task(batcher.submit(1, cost=1))
    await asyncio.wait_for(company.waiting.wait(), 5)  # alone: the worker waits for company
    later = [asyncio.create_task(batcher.submit(i, cost=1)) for i in (2, 3)]
    await asyncio.sleep(0)  # both queued while it waits
    company.over()
    assert await asyncio.wait_for(asyncio.gather(first, *later), 5) == [10, 20, 30]
    assert run.batches == [[1, 2, 3]]
    assert len(company.asked) == 1  # one wait, shared
    await batcher.close()


async def test_an_idle_request_waits_no_longer_than_the_bound_and_then_runs_alone(company: HeldWait) -> None:
    run = Recorder()
    batcher: Batcher[int, int] = Batcher(run, max_cost=100, max_wait_s=30.0, max_pending=64)
    request = asyncio.create_task(batcher.submit(7, cost=1))
    await asyncio.wait_for(company.waiting.wait(), 5)
    assert not request.done() and run.batches == []  # it waits, ...
    (asked,) = company.asked
    assert 0 < asked <= 30.0  # ... for what is left of the bound, never more
    company.over()
    assert await asyncio.wait_for(request, 5) == 70
    assert run.batches == [[7]] and len(company.asked) == 1  # then runs alone, without waiting again
    await batcher.close()


async def test_a_batch_never_passes_the_token_budget() -> None:
    run = Recorder()
    run.gate.clear()  # hold the first batch so the rest queue up behind it
    batcher: Batcher[int, int] = Batcher(run, max_cost=7, max_wait_s=0.0, max_pending=64)
    tasks = [asyncio.create_task(batcher.submit(i, cost=3)) for i in range(6)]
    big = asyncio.create_task(batcher.submit(99, cost=50))  # over budget alone: runs alone
    await asyncio.sleep(0.05)
    run.gate.set()
    await asyncio.gather(*tasks, big)
    assert all(len(batch) * 3 <= 7 or batch == [99] for batch in run.batches)
    assert [99] in run.batches
    assert sorted(i for batch in run.batches for i in batch) == [0, 1, 2, 3, 4, 5, 99]
    await batcher.close()


async def test_a_request_cancelled_while_queued_is_never_run() -> None:
    run = Recorder()
    run.gate.clear()
    batcher: Batcher[int, int] = Batcher(run, max_cost=1, max_wait_s=0.0, max_pending=64)
    first = asyncio.create_task(batcher.submit(1, cost=1))  # taken, held at the gate
    await asyncio.sleep(0.05)
    second = asyncio.create_task(batcher.submit(2, cost=1))  # queued behind it
    third = asyncio.create_task(batcher.submit(3, cost=1))
    await asyncio.sleep(0.05)
    second.cancel()  # the client hung up
    run.gate.set()
    assert await first == 10 and await third == 30
    with pytest.raises(asyncio.CancelledError):
        await second
    assert run.batches == [[1], [3]]
    assert batcher.stats.cancelled == 1
    await batcher.close()


async def test_a_full_queue_refuses_at_once() -> None:
    run = Recorder()
    run.gate.clear()
    batcher: Batcher[int, int] = Batcher(run, max_cost=1, max_wait_s=0.0, max_pending=2)
    held = asyncio.create_task(batcher.submit(0, cost=1))
    await asyncio.sleep(0.05)  # taken by the worker: no longer pending
    queued = [asyncio.create_task(batcher.submit(i, cost=1)) for i in (1, 2)]
    await asyncio.sleep(0.01)
    assert batcher.pending == 2
    refused = batcher.submit(3, cost=1)
    with pytest.raises(Overloaded):  # at once: on the call's first step, before it ever waits
        refused.send(None)
    assert batcher.stats.refused == 1 and batcher.pending == 2
    run.gate.set()
    assert await asyncio.gather(held, *queued) == [0, 10, 20]
    await batcher.close()


async def test_a_failed_batch_fails_each_of_its_callers() -> None:
    def broken(items: Sequence[int]) -> list[int]:
        raise RuntimeError("onnxruntime fell over")

    batcher: Batcher[int, int] = Batcher(broken, max_cost=10, max_wait_s=0.0, max_pending=8)
    with pytest.raises(RuntimeError, match="fell over"):
        await batcher.submit(1, cost=1)
    await batcher.close()


async def test_a_wrong_result_count_fails_that_batch_and_the_worker_serves_on() -> None:
    calls: list[list[int]] = []

    def short_once(items: Sequence[int]) -> list[int]:
        calls.append(list(items))
        results = [i * 10 for i in items]
        return results[:-1] if len(calls) == 1 else results

    batcher: Batcher[int, int] = Batcher(short_once, max_cost=10, max_wait_s=0.05, max_pending=8)
    first = await asyncio.wait_for(
        asyncio.gather(batcher.submit(1, cost=1), batcher.submit(2, cost=1), return_exceptions=True), 2
    )
    assert calls == [[1, 2]]
    assert all(isinstance(r, RuntimeError) and "2 requests" in str(r) for r in first), first
    assert await asyncio.wait_for(batcher.submit(3, cost=1), 2) == 30  # the worker is still there
    await batcher.close()


async def test_a_raising_batch_hook_fails_that_batch_and_the_worker_serves_on() -> None:
    hook_calls: list[int] = []

    def hook(items: int, cost: int, waited: float) -> None:
        hook_calls.append(items)
        if len(hook_calls) == 1:
            raise ValueError("metrics exporter broke")

    batcher: Batcher[int, int] = Batcher(Recorder(), max_cost=10, max_wait_s=0.0, max_pending=8, on_batch=hook)
    with pytest.raises(ValueError, match="exporter broke"):
        await asyncio.wait_for(batcher.submit(1, cost=1), 2)
    assert await asyncio.wait_for(batcher.submit(2, cost=1), 2) == 20
    await batcher.close()


async def test_close_while_a_batch_runs_fails_its_callers_and_the_queued_ones() -> None:
    run = Recorder()
    run.gate.clear()  # the batch stays in its thread until the test is done
    batcher: Batcher[int, int] = Batcher(run, max_cost=1, max_wait_s=0.0, max_pending=8)
    running = asyncio.create_task(batcher.submit(1, cost=1))
    await asyncio.sleep(0.05)  # taken: in the runner's thread
    queued = asyncio.create_task(batcher.submit(2, cost=1))
    await asyncio.sleep(0.01)
    try:
        await asyncio.wait_for(batcher.close(), 2)
        with pytest.raises(Closed):
            await asyncio.wait_for(running, 2)
        with pytest.raises(Closed):
            await asyncio.wait_for(queued, 2)
        with pytest.raises(Closed):
            await batcher.submit(3, cost=1)
    finally:
        run.gate.set()


async def test_a_cancelled_request_does_not_use_up_the_token_budget() -> None:
    # A caller's future can be cancelled before its task has run to take it off
    # the queue; the worker may take a batch in between, so it sees it queued.
    batcher: Batcher[int, int] = Batcher(Recorder(), max_cost=5, max_wait_s=0.0, max_pending=8)
    loop = asyncio.get_running_loop()
    for item, cost in [(1, 3), (2, 5), (3, 2)]:
        batcher._queue.append(_Waiting(item, cost, loop.create_future()))
    batcher._queue[1].future.cancel()  # item 2: 3 + 5 is over budget, but it will never run
    assert [w.item for w in batcher._take()] == [1, 3]
    assert not batcher._queue and batcher.stats.cancelled == 1
    batcher._queue.append(_Waiting(4, 1, loop.create_future()))
    batcher._queue[0].future.cancel()
    assert batcher._take() == [] and not batcher._queue


async def test_a_batch_wakes_its_callers_one_loop_turn_apart_and_close_answers_the_rest() -> None:
    batcher: Batcher[int, int] = Batcher(Recorder(), max_cost=8, max_wait_s=0.0, max_pending=8)
    turn = 0

    async def ticker() -> None:  # counts the loop's turns
        nonlocal turn
        while True:
            turn += 1
            await asyncio.sleep(0)

    woke: dict[int, int] = {}
    closing: list[asyncio.Task[None]] = []

    async def caller(item: int) -> int:
        result = await batcher.submit(item, cost=1)
        woke[item] = turn
        if item == 1:  # shutdown begins while the rest of the batch waits for its turn
            closing.append(asyncio.create_task(batcher.close()))
        return result

    ticking = asyncio.create_task(ticker())
    try:
        # Queued in one turn, before the worker first runs: one batch of three.
        results = await asyncio.wait_for(asyncio.gather(caller(1), caller(2), caller(3)), 2)
    finally:
        ticking.cancel()
    assert results == [10, 20, 30]  # the closed batcher still answered what it had computed
    assert woke[1] < woke[2]
    await asyncio.wait_for(closing[0], 2)
