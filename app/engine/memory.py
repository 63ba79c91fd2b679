"""Handing freed memory back to the operating system."""

from __future__ import annotations

import ctypes
import gc

# glibc's mallopt parameters (malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
# Blocks from this size up are mapped on their own and unmapped when freed: a build's vector chunks
# and a version's arrays. glibc starts at 128 KiB; 1 MiB keeps a request's small buffers in the heap.
MMAP_THRESHOLD = 1 << 20
# Free memory above this at the top of an arena goes back to the system on free(): twice the mmap
# threshold, the ratio glibc's own rule keeps.
TRIM_THRESHOLD = 2 << 20


def _glibc() -> ctypes.CDLL | None:
    """The C library, where it is glibc; None elsewhere (musl, macOS): nothing to tune or trim."""
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def fix_malloc_thresholds() -> bool:
    """Fixes glibc's mmap and trim thresholds before anything heavy loads; False where the C
    library is not glibc.

    Left to itself, glibc raises its mmap threshold to the largest mapped block freed so far (up
    to 32 MiB) and its trim threshold to twice that. After a reindex frees its ~15 MB vector
    chunks, a thread's arena may then keep up to ~30 MB of free memory at its top, and
    `malloc_trim` never trims the top of a thread's arena: a finished reindex thread's arena can
    stay ~30 MB resident, a step in RSS that the chaos suite's soak reads as growth.
    Fixed values switch that rule off."""
    libc = _glibc()
    if libc is None:
        return False
    return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))


def return_freed_memory() -> None:
    """A build allocates and frees hundreds of MB (vectors, graphs, the records). glibc keeps
    freed heap for reuse, so without this the process stays that much larger after every
    reindex. malloc_trim hands it back to the OS (free chunks in any arena, and the main
    arena's top; a thread arena's top is `fix_malloc_thresholds`' part)."""
    gc.collect()
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)
