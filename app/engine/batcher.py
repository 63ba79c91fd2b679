"""Dynamic micro-batching of encoder work, in the style of text-embeddings-inference.

Requests queue here; one worker takes what has queued, up to a token budget,
and runs it as one call in a thread. While a batch runs the next one gathers,
so under load each call carries many requests; when idle a request waits at
most `max_wait_s` for company. A batch's callers are woken one loop turn
apart (`_deliver`). Past `max_pending` queued requests, new ones
are refused at once (429), so overload shows as fast refusals rather than a
growing queue. A request whose caller gave up before its batch started is
dropped from the batch. Whatever goes wrong with a batch (the runner raises,
returns the wrong number of results, a metrics hook fails) fails that batch's
callers, never the worker: a dead worker would leave every later caller
waiting forever.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from app.engine.priority import SERVING, lowered
from app.engine.stats import STAGE_BOUNDS, Buckets

Item = TypeVar("Item")
Result = TypeVar("Result")


class Overloaded(Exception):
    pass


class Closed(Exception):
    """The batcher was closed (shutdown) before this request's result was ready."""


@dataclass(eq=False)
class _Waiting(Generic[Item, Result]):
    item: Item
    cost: int  # what the batch budget counts, in the caller's unit (the encoder's: EncodeJob.tokens)
    future: asyncio.Future[Result]
    queued_at: float = field(default_factory=time.perf_counter)


@dataclass
class BatchStats:
    """Running totals, for metrics and tests."""

    batches: int = 0
    items: int = 0
    cancelled: int = 0  # dropped before their batch ran
    refused: int = 0  # turned away with Overloaded
    last_batch_items: int = 0
    last_batch_cost: int = 0
    batch_items: Buckets = field(default_factory=lambda: Buckets((1, 2, 4, 8, 16, 32, 64)))
    batch_cost: Buckets = field(default_factory=lambda: Buckets((16, 64, 256, 1024, 4096)))
    queue_seconds: Buckets = field(default_factory=lambda: Buckets((0.001, 0.005, 0.02, 0.1, 0.5)))
    # Every request's wait, not only the oldest's: what a request pays in the queue (a /metrics stage).
    request_wait_seconds: Buckets = field(default_factory=lambda: Buckets(STAGE_BOUNDS))


class Batcher(Generic[Item, Result]):
    def __init__(
        self,
        run: Callable[[Sequence[Item]], Sequence[Result]],
        max_cost: int,
        max_wait_s: float,
        max_pending: int,
        on_batch: Callable[[int, int, float], None] | None = None,
    ) -> None:
        """run: items -> one result per item, in order; called in a worker thread, one batch at a time.

        on_batch(items, cost, seconds the oldest waited) is called as each batch starts (metrics)."""
        self.run = run
        self.max_cost = max_cost
        self.max_wait_s = max_wait_s
        self.max_pending = max_pending
        self.on_batch = on_batch
        self.stats = BatchStats()
        self._queue: deque[_Waiting[Item, Result]] = deque()
        self._arrived = asyncio.Event()
        self._worker: asyncio.Task[None] | None = None
        # The batch in the runner thread: close() must resolve these too, or
        # their callers wait forever once the worker is gone.
        self._running: list[_Waiting[Item, Result]] = []
        self._closed = False
        # One thread runs every batch (one batch runs at a time), through the loop's own
        # executor hop: ~50 µs a batch cheaper than anyio's to_thread (compute.py).
        # Below the event loop's priority, so refusals and health checks need not wait for a batch.
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="encoder", initializer=lowered(SERVING))

    @property
    def pending(self) -> int:
        return len(self._queue)

    async def submit(self, item: Item, cost: int) -> Result:
        """The item's result once its batch has run. Raises Overloaded when the queue is full,
        Closed once close() has been called."""
        if self._closed:
            raise Closed("the encoder queue is closed: shutting down")
        if len(self._queue) >= self.max_pending:
            self.stats.refused += 1
            raise Overloaded(f"{len(self._queue)} requests already waiting for the encoder")
        if self._worker is None or self._worker.done():
            self._worker = asyncio.get_running_loop().create_task(self._serve(), name="encoder-batcher")
        waiting: _Waiting[Item, Result] = _Waiting(item, cost, asyncio.get_running_loop().create_future())
        self._queue.append(waiting)
        self._arrived.set()
        try:
            return await waiting.future
        except asyncio.CancelledError:
            if waiting in self._queue:  # not started yet: it will never cost a thing
                self._queue.remove(waiting)
                self.stats.cancelled += 1
            raise

    def _take(self) -> list[_Waiting[Item, Result]]:
        """The oldest requests that fit the budget (always at least one)."""
        batch: list[_Waiting[Item, Result]] = []
        cost = 0
        while self._queue:
            if self._queue[0].future.done():  # cancelled while queued: it must not use up the budget
                self._queue.popleft()
                self.stats.cancelled += 1
                continue
            if batch and cost + self._queue[0].cost > self.max_cost:
                break
            waiting = self._queue.popleft()
            batch.append(waiting)
            cost += waiting.cost
        return batch

    async def _serve(self) -> None:
        while True:
            if not self._queue:
                self._arrived.clear()
                await self._arrived.wait()
            # An idle server waits a moment for company; a busy one does not: the
            # requests that queued while the last batch ran are the batch.
            oldest = self._queue[0].queued_at if self._queue else time.perf_counter()
            remaining = self.max_wait_s - (time.perf_counter() - oldest)
            if remaining > 0 and sum(w.cost for w in self._queue) < self.max_cost:
                await asyncio.sleep(remaining)
            batch = self._take()
            if not batch:
                continue
            # Not cleared on cancellation: close() cancels this worker and then fails what is still running.
            self._running = batch
            try:
                results = await self._run_batch(batch)
            except Exception as error:  # the whole batch failed: each caller gets the error, the worker lives on
                self._running = []
                for waiting in batch:
                    if not waiting.future.done():
                        waiting.future.set_exception(error)
                continue
            self._running = []
            await self._deliver(batch, results)

    async def _deliver(self, batch: list[_Waiting[Item, Result]], results: Sequence[Result]) -> None:
        """Wakes the batch's callers one loop turn at a time, and only then takes the next batch.

        Woken all at once, a batch's callers ran back to back, each through its search hop
        and response, while the sockets waited: under 200 connections flooding the in-flight
        limit (the chaos suite's flood) the refusals' p99 was ~108 ms. A turn each lets the loop read
        its sockets in between, and holds the next batch until the loop has: ~35-46 ms. At 1
        and 32 clients, where a turn is short, requests/s did not move (`python -m bench.profile`)."""
        try:
            for waiting, result in zip(batch, results, strict=True):
                if not waiting.future.done():  # a caller that gave up mid-batch gets nothing
                    waiting.future.set_result(result)
                    await asyncio.sleep(0)
        finally:  # cancelled by close(): the rest were computed, so they are answered still
            for waiting, result in zip(batch, results, strict=True):
                if not waiting.future.done():
                    waiting.future.set_result(result)

    async def _run_batch(self, batch: list[_Waiting[Item, Result]]) -> Sequence[Result]:
        cost = sum(w.cost for w in batch)
        self.stats.batches += 1
        self.stats.items += len(batch)
        self.stats.last_batch_items, self.stats.last_batch_cost = len(batch), cost
        self.stats.batch_items.observe(len(batch))
        self.stats.batch_cost.observe(cost)
        started = time.perf_counter()
        self.stats.queue_seconds.observe(started - batch[0].queued_at)
        for waiting in batch:
            self.stats.request_wait_seconds.observe(started - waiting.queued_at)
        if self.on_batch is not None:
            self.on_batch(len(batch), cost, time.perf_counter() - batch[0].queued_at)
        results = await asyncio.get_running_loop().run_in_executor(self._thread, self.run, [w.item for w in batch])
        if len(results) != len(batch):
            raise RuntimeError(f"the batch runner returned {len(results)} results for {len(batch)} requests")
        return results

    async def close(self) -> None:
        """Stops the worker; every caller still waiting, queued or in the running batch, gets Closed."""
        self._closed = True
        if self._worker is not None:
            self._worker.cancel()
            await asyncio.gather(self._worker, return_exceptions=True)
        # A running batch's thread cannot be stopped; its result, when it comes, has no one to go to.
        for waiting in [*self._running, *self._queue]:
            if not waiting.future.done():
                waiting.future.set_exception(Closed("the encoder queue closed before this request's batch finished"))
        self._running = []
        self._queue.clear()
        self._thread.shutdown(wait=False)
