"""The probe pacer: a connection that probes again within a second waits its turn; any other is answered
at once, however many are waiting; other routes never wait."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from starlette.types import Receive, Scope, Send

from app.probes import FREQUENT_S, ProbePacer

pytestmark = pytest.mark.anyio


async def answer(scope: Scope, receive: Receive, send: Send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def scope(path: str, port: int) -> dict[str, Any]:
    return {"type": "http", "path": path, "method": "GET", "client": ("10.0.0.1", port), "headers": []}


async def receive() -> dict[str, Any]:
    return {"type": "http.request", "body": b"", "more_body": False}


async def send(message: Any) -> None:
    return None


class Recorder:
    def __init__(self, rate_per_s: float) -> None:
        self.paced = 0
        self.pacer = ProbePacer(answer, rate_per_s=rate_per_s, on_paced=self.count)
        self.done: list[str] = []

    def count(self) -> None:
        self.paced += 1

    async def call(self, path: str, port: int, name: str) -> None:
        await self.pacer(scope(path, port), receive, send)
        self.done.append(name)


async def test_a_load_balancers_probes_never_wait() -> None:
    """One probe per connection, or a new connection each time: none is paced, at any rate."""
    probes = Recorder(rate_per_s=0.001)  # a turn every 1,000 s: a paced probe would hang the test
    for port in range(50):
        await asyncio.wait_for(probes.call("/readyz", 40_000 + port, f"p{port}"), 5)
    assert probes.paced == 0


async def test_a_frequent_prober_waits_and_a_fresh_connection_goes_first() -> None:
    probes = Recorder(rate_per_s=20)  # a turn each 50 ms
    await probes.call("/readyz", 1, "first")  # answered at once: connection 1 is now a frequent prober
    flood = [asyncio.create_task(probes.call("/readyz", 1, f"again{i}")) for i in range(4)]
    await asyncio.sleep(0)  # they all take their turns; the first repeat's is now, the others' 50 ms apart
    await probes.call("/livez", 2, "fresh")  # another connection's first probe
    assert probes.done == ["first", "again0", "fresh"]  # answered while the frequent ones still wait
    await asyncio.gather(*flood)
    assert probes.done[3:] == ["again1", "again2", "again3"]  # in the order they asked
    assert probes.paced == 3


async def test_other_routes_are_not_paced() -> None:
    probes = Recorder(rate_per_s=0.001)
    for i in range(5):
        await asyncio.wait_for(probes.call("/reply", 1, f"r{i}"), 5)
    assert probes.paced == 0


async def test_connections_are_forgotten_a_second_after_their_last_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1_000.0]
    monkeypatch.setattr("app.probes.time.monotonic", lambda: clock[0])
    probes = Recorder(rate_per_s=1_000)
    for port in range(10):
        await probes.call("/readyz", port, f"p{port}")
    assert len(probes.pacer.last_answered) == 10
    clock[0] += FREQUENT_S
    await probes.call("/readyz", 99, "later")
    assert list(probes.pacer.last_answered) == [("10.0.0.1", 99)]
