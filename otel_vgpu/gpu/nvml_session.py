"""NVML's session, and the seam every NVML call goes through: asked by name, as nvitop's
`nvmlQuery` does.

NVML may not be ready when the agent starts (the driver still loading on a booting node) and
may go away while it runs (a driver upgrade). Any failure to initialise, at start or after
`UNINITIALIZED` / `DRIVER_NOT_LOADED` mid-run, is retried with exponential backoff (1 s to
60 s) on the sweeps that follow, until NVML answers again. No restart is needed.

A call is named as nvidia-ml-py names it (`query("nvmlDeviceGetFanSpeed_v2", handle, 0,
default=None, scope=Scope(gpu=0))`): the seam looks it up, so that a function this
nvidia-ml-py lacks is the same absence as one the driver lacks (FUNCTION_NOT_FOUND), said
under its own name. What a session lacks is kept by (name, `Scope`) and not asked again until
NVML is initialised anew (a driver upgrade can bring it). A lost session always raises out.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from otel_vgpu.config import Backoff
from otel_vgpu.gpu.backend import ABSENT, NVML_RETURN_VALUES, ErrorCode, GpuError

# The backend's logger: a filter on otel_vgpu.gpu.nvml keeps every line about NVML.
log = logging.getLogger("otel_vgpu.gpu.nvml")

# Errors after which the NVML session is gone and must be initialised again.
SESSION_LOST = frozenset({ErrorCode.UNINITIALIZED, ErrorCode.DRIVER_NOT_LOADED, ErrorCode.LIB_RM_VERSION_MISMATCH})
# Errors that mean this machine cannot use NVML at all.
NO_LIBRARY = frozenset({ErrorCode.LIBRARY_NOT_FOUND, ErrorCode.FUNCTION_NOT_FOUND})
# What NVML answers for samples when none is newer than asked (all idle, not a failure),
# and for a MIG slot that holds no device.
NO_SAMPLES = EMPTY = frozenset({ErrorCode.NOT_FOUND})
# Any failure (a lost session still raises: `NvmlSession.query`): for figures that only name
# a device better, which NVML may refuse an unprivileged caller.
ANY_ERROR = frozenset(ErrorCode)


@dataclass(frozen=True, slots=True)
class Scope:
    """What the absence of a call holds for, in its session: with the call's name, the key
    under which it is kept. `Scope()` (`DRIVER`): the whole driver and library."""

    gpu: int | None = None
    """One GPU, by index (a GPU's index can change only across a re-initialisation)."""
    figure: str = ""
    """One figure of that GPU, where one call serves several (nvmlDeviceGetClockInfo: SM and
    memory clocks)."""
    instance: int | None = None
    """One MIG GPU instance of that GPU, by ID."""

    def __post_init__(self) -> None:
        if self.gpu is None and (self.figure or self.instance is not None):
            raise ValueError("a figure or a GPU instance is of a GPU")


DRIVER = Scope()


class NvmlSession:
    """The NVML session of one backend: initialised, lost, released for a driver upgrade and
    resumed; `query` and `call` ask NVML through it.

    `let_go` frees what NVML allocated for the backend before the session ends (event sets,
    GPM samples); `forget` drops what the backend keeps for one session (handles, what a GPU
    holds), at each start and end of one."""

    def __init__(
        self,
        nvml: Any,
        clock: Callable[[], float],
        backoff: Backoff,
        let_go: Callable[[], None],
        forget: Callable[[], None],
    ) -> None:
        self._nvml = nvml
        self._clock = clock
        self._let_go = let_go
        self._forget = forget
        self._lacking: set[tuple[str, Scope]] = set()
        """(function, scope) of the calls this NVML session lacks (`query`)."""
        self.ready = False
        self._released = False
        self.generation = 0
        """Which NVML session this is: a call that fails in an older one (a health read that
        hung across a driver pause and resume) tears down no newer one."""
        self.lock = threading.RLock()
        self._first_backoff, self._max_backoff = backoff.first, backoff.most
        self._backoff = self._first_backoff
        self._next_attempt = 0.0

    # --- the session --------------------------------------------------------------

    def initialise(self) -> None:
        with self.lock:
            try:
                self._nvml.nvmlInit()
            except self._nvml.NVMLError as error:
                self._next_attempt = self._clock() + self._backoff
                self._backoff = min(self._max_backoff, self._backoff * 2)
                raise GpuError(code_of(error), described(error)) from None
            self.generation += 1
            self.ready = True
            self._backoff = self._first_backoff
            self._forget_session()

    def ensure(self) -> None:
        """Initialised now, or GpuError: released for a driver upgrade, within the backoff, or
        refused again."""
        if self._released:
            raise GpuError(ErrorCode.UNINITIALIZED, "NVML released while the GPU driver is paused for an upgrade")
        if not self.ready:
            if self._clock() < self._next_attempt:
                wait = self._next_attempt - self._clock()
                raise GpuError(ErrorCode.UNINITIALIZED, f"NVML is not initialised; next attempt in {wait:.0f} s")
            self.initialise()
            log.info("NVML initialised")

    def in_session(self) -> bool:
        """Whether NVML may be called now: initialised, and not released for a driver upgrade."""
        return self.ready and not self._released

    def lost(self, generation: int | None = None) -> None:
        """NVML's session is gone (the driver unloaded or changed): let go of it, and try again
        with backoff; a call of an older `generation` than the current one changes nothing."""
        with self.lock:
            if generation is not None and generation != self.generation:
                return
            self.generation += 1
            self._let_go()
            with contextlib.suppress(self._nvml.NVMLError):
                self._nvml.nvmlShutdown()
            self.ready = False
            self._forget_session()
            self._next_attempt = self._clock() + self._backoff
            self._backoff = min(self._max_backoff, self._backoff * 2)

    def release(self) -> None:
        """nvmlShutdown: NVML closes the driver's device files (/dev/nvidiactl,
        /dev/nvidia<N>), whose references keep the kernel module loaded."""
        with self.lock:
            if self.ready:
                self._let_go()
                with contextlib.suppress(self._nvml.NVMLError):
                    self._nvml.nvmlShutdown()
            self.generation += 1
            self.ready = False
            self._released = True
            self._forget_session()

    def resume(self) -> None:
        self._released = False
        self._next_attempt = 0.0
        self._backoff = self._first_backoff

    def close(self) -> None:
        if self.ready:
            self._let_go()
        with contextlib.suppress(self._nvml.NVMLError):
            self._nvml.nvmlShutdown()

    def _forget_session(self) -> None:
        self._lacking.clear()
        self._forget()

    # --- calls --------------------------------------------------------------------

    def query(
        self,
        name: str,
        *args: Any,
        default: Any,
        absent: frozenset[ErrorCode] = ABSENT,
        scope: Scope | None = None,
        say: str | None = None,
    ) -> Any:
        """nvidia-ml-py's `name(*args)`, or `default` where NVML answers one of `absent` (by
        default, the call this driver or GPU does not have; a function this nvidia-ml-py lacks
        answers FUNCTION_NOT_FOUND). With a `scope`, the absence is kept for this NVML session
        and the call not made again; `say` is logged once when it is, else a line that names
        the call. Any other failure raises GpuError, as `call` does, and so does a lost
        session, whatever `absent` says: one declaration per call that may be missing, as
        nvitop's nvmlQuery does with `default=` and its UNKNOWN_FUNCTIONS."""
        if scope is not None and (name, scope) in self._lacking:
            return default
        try:
            return self.call(name, *args)
        except GpuError as error:
            if error.code in SESSION_LOST or error.code not in absent:
                raise
            if scope is not None:
                self._lacking.add((name, scope))
                log.info("%s", say or f"NVML lacks {name} here ({error.code.value}); what it gives is left out")
            return default

    def lacks(self, name: str, scope: Scope) -> bool:
        """Whether this nvidia-ml-py has no `name`, or this session found it absent for `scope`."""
        return (name, scope) in self._lacking or not self.has(name)

    def has(self, name: str) -> bool:
        """Whether this nvidia-ml-py has a function `name` (the driver may lack it still)."""
        return callable(getattr(self._nvml, name, None))

    def newest(self, name: str, *older: str) -> str:
        """The first of `name`, then `older`, that this nvidia-ml-py has; `name` where it has none."""
        return next((each for each in (name, *older) if self.has(each)), name)

    def call(self, name: str, *args: Any) -> Any:
        """nvidia-ml-py's `name(*args)`; GpuError with NVML's code where it fails, after which
        a lost session is let go of."""
        function = getattr(self._nvml, name, None)
        if not callable(function):
            raise GpuError(ErrorCode.FUNCTION_NOT_FOUND, f"{name} is not in this nvidia-ml-py")
        generation = self.generation
        try:
            return function(*args)
        except self._nvml.NVMLError as error:
            code = code_of(error)
            if code in SESSION_LOST:
                self.lost(generation)
            raise GpuError(code, described(error)) from None

    def free(self, name: str, *args: Any) -> None:
        """nvidia-ml-py's `name(*args)` for what NVML allocated (an event set, a GPM sample),
        any failure ignored: it runs as the session ends, which may be over already, and it
        ends nothing itself."""
        with contextlib.suppress(self._nvml.NVMLError):
            getattr(self._nvml, name)(*args)


def code_of(error: Any) -> ErrorCode:
    # nvidia-ml-py's NVMLError carries NVML's return code as `value`.
    return NVML_RETURN_VALUES.get(getattr(error, "value", 999), ErrorCode.UNKNOWN)


def described(error: Any) -> str:
    try:
        return str(error)
    except Exception:  # nvidia-ml-py's __str__ calls into NVML, which may be gone
        return code_of(error)
