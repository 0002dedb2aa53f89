"""Giving memory back to the system after a burst (glibc; nothing elsewhere).

A flood of connections (TLS handshakes above all: asyncio gives each a 256 KiB
buffer, OpenSSL its own structures) leaves freed memory that glibc keeps for
reuse. The agent's limit is a container's, so it hands it back: large buffers
get memory of their own, returned when freed, and the endpoint trims the heap
once a burst of connections has ended.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from typing import Any

# glibc's mallopt parameter for the size above which malloc maps memory of its own.
M_MMAP_THRESHOLD = -3


@functools.cache
def _libc() -> Any:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None


def return_freed_memory() -> None:
    """Keep large buffers in memory of their own. glibc otherwise raises this
    threshold after the first such buffer is freed, and later ones come from
    the heap, whose freed pages it keeps."""
    libc = _libc()
    if libc is not None:
        libc.mallopt(M_MMAP_THRESHOLD, 128 * 1024)


def trim() -> None:
    """Hand the heap's free pages back to the system."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)
