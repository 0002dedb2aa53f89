"""The process's memory: glibc's heap after a burst, and Python's garbage collector.

A flood of connections (TLS handshakes above all: asyncio gives each a read
buffer, 32 KiB here (endpoint/connections.py TLS_READ_BYTES), OpenSSL its own structures)
leaves freed memory that glibc keeps for
reuse. The agent's limit is a container's, so it hands it back: large buffers
get memory of their own, returned when freed, and the endpoint trims the heap
once a burst of connections has ended.

A scrape allocates tens of thousands of short-lived objects (a measurement, a
dict and a data point per series), which with Python's default thresholds
start a full collection every few scrapes; a full collection walks every
object the agent holds, and was the p99 of a scrape (33 ms against a 12 ms
median at 80 pods, 112 against 63 at 384: bench/README.md).
`quiet_collector` is called once the agent serves.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
from typing import Any

# Allocations between young collections (Python's default: 700), then the older generations' factors.
GC_THRESHOLDS = (20_000, 20, 20)
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
    """Collect the cycles a burst of connections left (asyncio's transports,
    protocols and streams refer to each other, and a closed connection's buffers
    wait in those cycles for a collection the quiet thresholds make rare), then
    hand the heap's free pages back to the system. The collection does not walk
    what `quiet_collector` froze, so it costs what the burst left, not the agent."""
    gc.collect()
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


def quiet_collector() -> None:
    """Keep the collector off the scrape path: what the agent built to start
    (modules, the SDK, the server) is moved out of the collector's sight, and
    young collections run every 20,000 allocations. Garbage without cycles is
    freed by reference counting as before; only cycles wait longer."""
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
