"""SIGTERM: not ready at once, the listener closed only after the configured delay."""

from __future__ import annotations

import os
import signal
import threading
from types import FrameType

from app.main import _on_sigterm


def test_sigterm_marks_draining_at_once_and_hands_over_to_the_server_after_the_delay() -> None:
    handed_over = threading.Event()
    draining = threading.Event()

    def server_handler(signum: int, frame: FrameType | None) -> None:  # uvicorn's: closes the listener
        handed_over.set()

    original = signal.signal(signal.SIGTERM, server_handler)
    try:
        restore = _on_sigterm(draining.set, delay_s=0.5)
        os.kill(os.getpid(), signal.SIGTERM)
        assert draining.is_set()
        assert not handed_over.is_set()  # still serving, with /readyz at 503
        assert handed_over.wait(timeout=10)
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
