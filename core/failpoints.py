"""Failpoints: named places where a fault can be made to happen on purpose, for the chaos suite.

    CHITCHAT_FAILPOINTS="store.pointer=1,2"   # the 1st and 2nd pointer writes fail with ENOSPC

Some faults cannot be caused from outside a process at the moment that matters
(a full disk exactly as the pointer is written, after the history is). A
failpoint raises the error such a fault raises, at that place, on the hits
the variable names (counted from the process's start); everywhere else, and
whenever the variable is unset, it costs a dict lookup. The same idea as
etcd's gofail and TiKV's fail-rs, cut to what the suite uses.
"""

from __future__ import annotations

import errno
import os
import threading
from collections import Counter

ENV = "CHITCHAT_FAILPOINTS"

_lock = threading.Lock()
_hits: Counter[str] = Counter()
_armed: dict[str, set[int]] | None = None


def _parse(raw: str) -> dict[str, set[int]]:
    """Reads "a=1,2;b=3" as {"a": {1, 2}, "b": {3}}."""
    armed: dict[str, set[int]] = {}
    for item in filter(None, (part.strip() for part in raw.split(";"))):
        name, _, hits = item.partition("=")
        armed[name.strip()] = {int(h) for h in hits.split(",") if h.strip()}
    return armed


def hit(name: str) -> None:
    """Raises OSError(ENOSPC) if this is a hit of `name` that CHITCHAT_FAILPOINTS names."""
    global _armed
    with _lock:
        if _armed is None:
            _armed = _parse(os.environ.get(ENV, ""))
        if name not in _armed:
            return
        _hits[name] += 1
        failing = _hits[name] in _armed[name]
    if failing:
        raise OSError(errno.ENOSPC, f"failpoint {name} (hit {_hits[name]})")
