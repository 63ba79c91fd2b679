"""SIGTERM: not ready at once, the listener closed only after the configured delay."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

import pytest

from app import main as main_module
from app.main import _on_sigterm


class HeldTimer:
    """threading.Timer as _on_sigterm sees it: started, and fired when the test says the delay is over."""

    def __init__(self, interval: float, function: Callable[..., None], args: tuple[Any, ...]) -> None:
        self.interval, self.function, self.args = interval, function, args
        self.daemon = False
        self.started = False

    def start(self) -> None:
        self.started = True

    def fire(self) -> None:
        assert self.started
        self.function(*self.args)


class _ThreadingWith:
    """The threading module as app.main sees it, with held timers."""

    def __init__(self) -> None:
        self.timers: list[HeldTimer] = []

    def Timer(self, interval: float, function: Callable[..., None], args: tuple[Any, ...]) -> HeldTimer:
        self.timers.append(HeldTimer(interval, function, args))
        return self.timers[-1]

    def __getattr__(self, name: str) -> Any:
        return getattr(threading, name)


def test_sigterm_marks_draining_at_once_and_hands_over_to_the_server_after_the_delay(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    handed_over = threading.Event()
    draining = threading.Event()

    def server_handler(signum: int, frame: FrameType | None) -> None:  # uvicorn's: closes the listener
        handed_over.set()

    threads = _ThreadingWith()
    monkeypatch.setattr(main_module, "threading", threads)
    original = signal.signal(signal.SIGTERM, server_handler)
    try:
        restore = _on_sigterm(draining.set, delay_s=0.5)
        os.kill(os.getpid(), signal.SIGTERM)
        assert draining.is_set()
        assert not handed_over.is_set()  # still serving, with /readyz at 503 ...
        (timer,) = threads.timers
        assert timer.started and timer.interval == 0.5  # ... until the delay is over
        assert timer.daemon  # an exit by another path need not wait for it
        timer.fire()
        assert handed_over.is_set()
        restore()
        assert signal.getsignal(signal.SIGTERM) is server_handler
    finally:
        signal.signal(signal.SIGTERM, original)


def test_without_a_delay_the_server_handler_runs_in_the_signal_handler() -> None:
    calls: list[str] = []
    original = signal.signal(signal.SIGTERM, lambda signum, frame: calls.append("server"))
    try:
        restore = _on_sigterm(lambda: calls.append("draining"))
        os.kill(os.getpid(), signal.SIGTERM)
        assert calls == ["draining", "server"]
        restore()
    finally:
        signal.signal(signal.SIGTERM, original)
