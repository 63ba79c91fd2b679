"""Serving's heavy threads run below the event loop's priority, a reindex's below theirs (Linux)."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import pytest

from app.engine import priority
from app.engine.batcher import Batcher
from app.engine.compute import ComputePool
from app.engine.runtime import load_model
from tests.helpers import settings_for

pytestmark = [pytest.mark.anyio, pytest.mark.skipif(sys.platform != "linux", reason="per-thread niceness is Linux's")]


def _nice(tid: int) -> int:
    return os.getpriority(os.PRIO_PROCESS, tid)


def _threads() -> set[int]:
    return {int(t) for t in os.listdir("/proc/self/task")}


def _loop_nice() -> int:
    return _nice(os.getpid())


def test_every_thread_of_a_serving_encoder_session_starts_below_the_loop(artifacts: Path) -> None:
    before = _threads()
    model = load_model(settings_for(artifacts, ort_intra_op_threads=2, ort_spin_alone=True))
    started = _threads() - before
    assert started, "two intra-op threads per session: onnxruntime starts one worker each"
    assert {_nice(t) for t in started} == {min(priority.MAX_NICE, _loop_nice() + priority.SERVING)}
    assert model.encoder.encode(["still answers"], "context").shape[0] == 1


async def test_the_encoder_batch_thread_and_the_search_threads_run_below_the_loop() -> None:
    seen: list[int] = []

    def run(items: object) -> list[int]:
        seen.append(_nice(threading.get_native_id()))
        return [0]

    batcher: Batcher[int, int] = Batcher(run, max_cost=8, max_wait_s=0, max_pending=4)
    await batcher.submit(1, 1)
    pool = ComputePool(max_pending=4)
    seen.append(await pool.run(lambda: _nice(threading.get_native_id())))
    pool.close()
    assert seen == [min(priority.MAX_NICE, _loop_nice() + priority.SERVING)] * 2
    assert _nice(threading.get_native_id()) == _loop_nice()  # the loop itself is untouched


def test_levels_are_counted_from_the_loop_and_capped() -> None:
    seen: list[int] = []
    priority.in_lowered_thread(lambda: seen.append(_nice(threading.get_native_id())), priority.BACKGROUND)
    priority.in_lowered_thread(lambda: seen.append(_nice(threading.get_native_id())), 40)
    assert seen == [min(priority.MAX_NICE, _loop_nice() + priority.BACKGROUND), priority.MAX_NICE]


def test_a_failure_in_the_lowered_thread_is_raised_to_the_caller() -> None:
    def broken() -> None:
        raise ValueError("no such bundle")

    with pytest.raises(ValueError, match="no such bundle"):
        priority.in_lowered_thread(broken, priority.SERVING)
