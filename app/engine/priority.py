"""CPU priority of the threads that do serving's heavy work, below the event loop's.

The event loop answers what must stay fast under any load: 429 refusals, /livez, /readyz. On two
cores the encoder's threads and the search threads can keep both cores busy, and at equal priority
the loop waits its turn behind them, and the refusals of the chaos suite's flood of the in-flight
limit miss their 50 ms p99 bar (docs/experiments.md). At a lower priority (a higher Linux nice, per
thread) the scheduler runs the loop as soon as it wakes, and the heavy threads still take every
cycle the loop leaves. A reindex runs lower still, so live requests keep most of the machine.

Linux keeps niceness per thread, and a thread starts with its creator's: onnxruntime's intra-op
threads are started when a session is created, so a session made in a lowered thread
(`in_lowered_thread`) has every one of its threads lowered. Levels are relative to the main
thread's, where the loop runs, so a service started under `nice` keeps the same order. Nice orders
threads within their session's autogroup, where the kernel has them: it ranks the service's own
threads, not the service against other programs.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

# The encoder and search threads: the loop gets ~9/10 of a core it contends for with one of them
# (weights 1024:110); at 5 levels (1024:335) it gets about 3/4, and the in-flight-limit flood's
# refusals p99 reads higher (docs/experiments.md). The loop's own work is bounded (it parses,
# refuses and hands off), so the heavy threads lose only what a flood makes the loop spend.
SERVING = 10
BACKGROUND = 19  # a reindex: ~7:1 behind the serving threads (weights 110:15)
MAX_NICE = 19


def lower_this_thread(levels: int) -> None:
    """Runs the calling thread `levels` nice steps below the main thread. Not Linux, or not
    permitted: it keeps its priority, and the service works as before, only with a slower loop
    under load."""
    with contextlib.suppress(OSError, AttributeError):
        loop_nice = os.getpriority(os.PRIO_PROCESS, os.getpid())  # the main thread's (Linux: pid = its tid)
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), min(MAX_NICE, loop_nice + levels))


def lowered(levels: int) -> Callable[[], None]:
    """A ThreadPoolExecutor initializer: each worker lowers itself before its first task."""
    return lambda: lower_this_thread(levels)


def in_lowered_thread(make: Callable[[], T], levels: int) -> T:
    """make() called in a new thread `levels` below the loop, so whatever threads it starts (an
    onnxruntime session's) start lowered too. Waits for it; its exception is raised here."""
    outcome: list[T] = []
    failure: list[BaseException] = []

    def run() -> None:
        lower_this_thread(levels)
        try:
            outcome.append(make())
        except BaseException as error:  # handed to the caller, which raises it
            failure.append(error)

    thread = threading.Thread(target=run, name="lowered-start")
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return outcome[0]
