"""Pacing for the health probes (/livez, /healthz, /readyz), which anyone may call.

A probe is cheap, but never free: each costs the event loop a request's parsing and answer, and a
client that sends the next one as soon as it has the last (400 keep-alive sockets on /readyz, the
chaos suite's /readyz flood) keeps the loop busy with nothing else, and every /reply then waits a
whole round of the loop at each of its steps (docs/experiments.md has the figures).

Refusing them would not help: a 429 costs the loop what an answer does, and the flood asks again at
once. Probes are delayed instead, as nginx's limit_req delays what is past its rate: a waiting probe
is a sleeping coroutine and costs nothing until its turn. Only a connection that probed within the
last second waits, so a load balancer's probes (one a second or fewer per connection, or a new
connection each) are answered at once, flood or not; frequent probers share `rate_per_s` answers a
second among them, in the order they asked.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable

from starlette.types import ASGIApp, Receive, Scope, Send

PROBE_PATHS = frozenset({"/livez", "/healthz", "/readyz"})
FREQUENT_S = 1.0  # a connection whose last probe was answered this recently is a frequent prober
MAX_TRACKED = 100_000  # connections remembered at most (a few hundred bytes each); the oldest go first


class ProbePacer:
    """ASGI middleware: a probe from a connection answered within FREQUENT_S waits for the next of
    `rate_per_s` turns a second; any other request passes at once."""

    def __init__(self, app: ASGIApp, rate_per_s: float, on_paced: Callable[[], None]) -> None:
        self.app = app
        self.on_paced = on_paced  # a probe waited its turn (/metrics counts them)
        self.interval_s = 1.0 / rate_per_s
        self.next_slot = 0.0  # monotonic time of the next frequent probe's turn
        self.last_answered: OrderedDict[tuple[str, int], float] = OrderedDict()  # connection -> when, oldest first

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in PROBE_PATHS or scope.get("client") is None:
            await self.app(scope, receive, send)
            return
        connection = (str(scope["client"][0]), int(scope["client"][1]))
        now = time.monotonic()
        if now - self.last_answered.get(connection, -FREQUENT_S) < FREQUENT_S:
            turn = max(now, self.next_slot)
            self.next_slot = turn + self.interval_s
            if turn > now:
                self.on_paced()
                await asyncio.sleep(turn - now)
        try:
            await self.app(scope, receive, send)
        finally:
            self._answered(connection)

    def _answered(self, connection: tuple[str, int]) -> None:
        now = time.monotonic()
        self.last_answered[connection] = now
        self.last_answered.move_to_end(connection)
        while self.last_answered:
            oldest, at = next(iter(self.last_answered.items()))
            if now - at < FREQUENT_S and len(self.last_answered) <= MAX_TRACKED:
                break
            del self.last_answered[oldest]
