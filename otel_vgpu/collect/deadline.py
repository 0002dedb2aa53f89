"""Driver calls made with a deadline: each on a thread of its GPU's own, waited for at most so
long. NVML calls cannot be interrupted, so a call that never returns holds its thread, and
that GPU's next call is refused until it does: one hung GPU holds one thread, never the
caller, and never another GPU (collect/device_health.py, collect/gpm_reads.py's GPM reads,
collect/xids.py's XID events). Where several GPUs are read, their calls are begun together and
waited for after (`start`, then `wait`), so that slow GPUs cost the caller one deadline, not
one each: 8 GPUs at 0.9 s a GPM call, waited for in turn, held a sweep 7.2 s.
NVML is thread-safe (nvml.h: "it is safe to make simultaneous NVML calls from multiple
threads")."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from otel_vgpu.threads import NamedThread

log = logging.getLogger(__name__)


class CallThread:
    """One GPU's calls, one at a time, on a thread of their own."""

    def __init__(self, name: str) -> None:
        self._asked = threading.Event()
        self._done = threading.Event()
        self._done.set()
        self._call: Callable[[], Any] = lambda: None
        self._result: Any = None
        self._error: BaseException | None = None
        self.stopped = False
        self.took = 0.0
        """How long the last call that returned took, on this thread."""
        self._thread = NamedThread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @property
    def busy(self) -> bool:
        """A call is in flight (maybe hung in the driver)."""
        return not self._done.is_set()

    def start(self, call: Callable[[], Any]) -> bool:
        """Begin `call`; False (nothing begun) while the last one is still in flight."""
        if self.busy or self.stopped:
            return False
        self._call, self._result, self._error = call, None, None
        self._done.clear()
        self._asked.set()
        return True

    def wait(self, timeout: float) -> bool:
        """Whether the call in flight has returned within `timeout` seconds."""
        return self._done.wait(timeout)

    def result(self) -> Any:
        """The returned call's value; what it raised, raised again."""
        if self._error is not None:
            raise self._error
        return self._result

    def run(self, call: Callable[[], Any], deadline_s: float) -> tuple[bool, Any]:
        """`call` begun and waited for at most `deadline_s`: (True, its value), or (False, None)
        where it is still in flight or the last one was. What it raised is raised."""
        if not self.start(call) or not self.wait(deadline_s):
            return False, None
        return True, self.result()

    def stop(self) -> None:
        self.stopped = True
        if not self.busy:
            self._asked.set()

    def _run(self) -> None:
        while not self.stopped:
            self._asked.wait()
            self._asked.clear()
            if self.stopped:
                return
            started = time.monotonic()
            try:
                self._result = self._call()
            except BaseException as error:  # handed to the caller, which says what failed
                self._error = error
            finally:
                self.took = time.monotonic() - started
                self._done.set()
