"""Threads named for the kernel too, so that top, ps and /proc/<pid>/task/<tid>/comm say which
of the agent's threads uses what (Python before 3.14 names its threads for itself only)."""

from __future__ import annotations

import contextlib
import ctypes
import threading

# prctl(2): PR_SET_NAME, a name of at most 15 bytes.
PR_SET_NAME = 15


def name_this_thread(name: str | None = None) -> None:
    """Give the calling thread `name`, by default its Python name, in the kernel's view;
    nothing where libc will not. A ThreadPoolExecutor's `initializer` for its workers."""
    name = name or threading.current_thread().name
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0)


class NamedThread(threading.Thread):
    """A thread that gives the kernel its name as it starts: every thread of the agent's."""

    def run(self) -> None:
        name_this_thread(self.name)
        super().run()
