"""Handing freed memory back to the operating system."""

from __future__ import annotations

import contextlib
import ctypes
import gc


def return_freed_memory() -> None:
    """A build allocates and frees hundreds of MB (vectors, graphs, the records). glibc keeps
    freed heap for reuse, so without this the process stays that much larger after every
    reindex. malloc_trim hands it back to the OS."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to trim
        ctypes.CDLL("libc.so.6").malloc_trim(0)
