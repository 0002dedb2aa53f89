"""A GPU's health, its GPM figures and its XID events, from NVML (gpu/nvml_session.py's seam).

Each health figure is read as its entry in gpu/device_figures.py's `HEALTH_TABLE` says: its
call by name, its arguments, the element of the answer it takes, its scale, the engine it
needs and what NVML answers where the GPU lacks it; the figures of one call and arguments
share that call, and the compound reads (`READS`) serve several figures of different
arguments with one call. What the driver or GPU does not have is noted once for the NVML
session, said once naming the families left out, and not asked again; any other failure of a
read costs its figures that reading alone (`HealthReading.failed`), never the GPU's other
figures; a lost GPU or session raises out, as everywhere else. Every call below answers an
unprivileged process (measured on an H200 with driver 580 as uid 0 with no capability and as
uid 65534: issue #39). The calls and units are nvml.h's (NVIDIA/go-nvml pkg/nvml/nvml.h, CUDA
13.3): clocks in MHz, power in mW, the violation counters in ns, GPM utilizations in percent
and its byte rates in MiB/s.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from otel_vgpu.gpu.backend import ErrorCode, FailedRead, GpuError, HealthReading, XidEvent
from otel_vgpu.gpu.device_figures import ECC, FIELD_VALUES, GPM_MIN_INTERVAL_S, GPM_TABLE, HEALTH_TABLE, HealthFigure
from otel_vgpu.gpu.nvml_session import ANY_ERROR, DRIVER, SESSION_LOST, NvmlSession, Scope

log = logging.getLogger(__name__)

# nvmlValueType_t to the member of nvmlValue_t that holds it.
VALUE_MEMBERS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}
# nvmlEnableState_t's NVML_FEATURE_ENABLED, as nvmlDeviceGetEccMode answers the current mode.
ECC_MODE, ECC_ON = "nvmlDeviceGetEccMode", 1
# nvmlEventTypeXidCriticalError.
EVENT_XID = 0x8
# What every figure of a GPU would fail alike: the session lost, or the GPU fallen off the bus.
GPU_GONE = SESSION_LOST | {ErrorCode.GPU_IS_LOST}

_TIMEOUT = frozenset({ErrorCode.TIMEOUT})


@dataclass(slots=True)
class Asking:
    """One reading of GPU `index`'s health: how each of its reads asks NVML, and what failed."""

    seam: NvmlSession
    handle: Any
    index: int
    kept: dict[tuple[int, str], Any]
    """What holds for the NVML session (the backend clears it with its handles): the ECC mode."""
    failed: list[FailedRead] = field(default_factory=list)

    def figures(self, figures: tuple[HealthFigure, ...], name: str, *args: Any) -> Any:
        """`name(handle, *args)`, the call `figures` come from, None where the GPU lacks it (as
        the first of them says in `absent`): said once, naming their families, and not asked
        again this session. The absence is kept by the call and the figures' names."""
        return self.seam.query(
            name,
            self.handle,
            *args,
            default=None,
            absent=figures[0].absent,
            scope=Scope(gpu=self.index, figure=",".join(figure.name for figure in figures)),
            say=f"GPU {self.index} does not report {_what(figures, name)}: {_families(figures)} left out",
        )

    def failing(self, figures: tuple[HealthFigure, ...], error: GpuError) -> None:
        """A read of `figures` failed: they are left out of this reading; raised where the GPU
        or the session is gone, which every figure shares."""
        if error.code in GPU_GONE:
            raise error
        self.failed.append(FailedRead(tuple(figure.name for figure in figures), error))


HealthRead = Callable[[Asking, tuple[HealthFigure, ...]], dict[str, float]]
"""A read of health figures: the figures of one `HealthFigure.read` from its one call, or the
figures of one call and arguments from that call (`READS`)."""


def _answer(ask: Asking, figures: tuple[HealthFigure, ...]) -> dict[str, float]:
    """One call, the newest of its names this nvidia-ml-py has, for the figures of the same
    call and arguments: each its element of the answer (`HealthFigure.take`)."""
    first = figures[0]
    name = ask.seam.newest(first.call, *first.older)
    answer = ask.figures(figures, name, *first.args)
    if answer is None:
        return {}
    return {figure.name: figure.published(float(figure.taken(answer))) for figure in figures}


def _field_values(ask: Asking, figures: tuple[HealthFigure, ...]) -> dict[str, float]:
    """The figures NVML gives as field values: one call, each field with its own status."""
    by_id = {figure.args[0]: figure for figure in figures}
    out: dict[str, float] = {}
    for value in ask.figures(figures, figures[0].call, list(by_id)) or ():
        figure = by_id.get(int(value.fieldId))
        if figure is not None and int(value.nvmlReturn) == 0 and int(value.valueType) in VALUE_MEMBERS:
            out[figure.name] = figure.published(float(getattr(value.value, VALUE_MEMBERS[int(value.valueType)])))
    return out


def _ecc(ask: Asking, figures: tuple[HealthFigure, ...]) -> dict[str, float]:
    """The volatile ECC totals, where ECC is on (nvmlDeviceGetTotalEccErrors requires it).
    The mode is asked once an NVML session: "Changing ECC modes requires a reboot" (nvml.h,
    nvmlDeviceGetEccMode), and a session begins at every start and every driver reload. A mode
    a GPU reset applied while the session lasts is seen at the next one; until then a count
    NVML no longer gives is left out, as any figure it lacks. At 0.16 ms on an H200 the mode
    was the dearest health call after the PCIe replay counter (bench/results/h200-health.md).
    A mode that fails costs every count; a count that fails, itself alone."""
    if (ask.index, ECC_MODE) not in ask.kept:
        ask.kept[(ask.index, ECC_MODE)] = ask.figures(figures, ECC_MODE)
    mode = ask.kept[(ask.index, ECC_MODE)]
    if mode is None or int(mode[0]) != ECC_ON:
        return {}
    out: dict[str, float] = {}
    for figure in figures:
        try:
            count = ask.figures((figure,), figure.call, *figure.args)
        except GpuError as error:
            ask.failing((figure,), error)
            continue
        out |= {} if count is None else {figure.name: figure.published(float(count))}
    return out


READS: dict[str, HealthRead] = {"": _answer, FIELD_VALUES: _field_values, ECC: _ecc}
"""Each read of `HealthFigure.read`, by name; "": a figure's `call`, once for the figures of the
same call and arguments."""


def grouped(table: tuple[HealthFigure, ...]) -> tuple[tuple[str, tuple[HealthFigure, ...]], ...]:
    """`table`'s figures by read, in the table's order: those of one compound read together,
    the others by call and arguments."""
    groups: dict[tuple[str, str, tuple[int, ...]], list[HealthFigure]] = {}
    for figure in table:
        key = (figure.read, "", ()) if figure.read else ("", figure.call, figure.args)
        groups.setdefault(key, []).append(figure)
    return tuple((read, tuple(figures)) for (read, _, _), figures in groups.items())


HEALTH_BY_READ = grouped(HEALTH_TABLE)
"""`HEALTH_TABLE`'s figures by their read, as `read_health` reads them."""


def read_health(
    handle: Any,
    index: int,
    seam: NvmlSession,
    kept: dict[tuple[int, str], Any],
    reads: tuple[tuple[str, tuple[HealthFigure, ...]], ...] = HEALTH_BY_READ,
    engines: Callable[[], frozenset[str]] = frozenset,
) -> HealthReading:
    """GPU `index`'s health figures now, each read as its table entry says (`reads`: the table's,
    `grouped`); each one the GPU or driver lacks is left out, and so is each whose read failed,
    with its failure, and each of an engine the GPU does not have (`engines`, asked only where
    a figure has one). `kept` keeps what holds for the NVML session (the backend clears it with
    its handles)."""
    ask = Asking(seam, handle, index, kept)
    out: dict[str, float] = {}
    for read, group in reads:
        figures = group
        try:  # whether the GPU has an engine is asked of NVML too, and fails as the read would
            figures = tuple(figure for figure in group if not figure.engine or _has(ask, figure, engines))
            if figures:
                out |= READS[read](ask, figures)
        except GpuError as error:
            ask.failing(figures, error)
    return HealthReading(out, tuple(ask.failed))


def _has(ask: Asking, figure: HealthFigure, engines: Callable[[], frozenset[str]]) -> bool:
    """Whether the GPU has `figure`'s engine; where it has not, said once a session."""
    if figure.engine in engines():
        return True
    said = (ask.index, f"without {figure.engine}: {figure.name}")
    if said not in ask.kept:
        ask.kept[said] = None
        log.info("GPU %d has no %s: %s is left out", ask.index, figure.engine, figure.prometheus_name)
    return False


class GpmSamples:
    """GPM samples, two buffers per GPU (and MIG GPU instance), as nvml.h asks ("at least two
    of these buffers"): each read takes a sample into the buffer the last read let go, returns
    the figures between it and the one before (nvmlGpmMetricsGet), and keeps the older buffer
    for the next read, so that no window pays NVML's allocation and free. Samples are NVML
    allocations: `free` must run before nvmlShutdown."""

    def __init__(self, nvml: Any, seam: NvmlSession, clock: Callable[[], float] = time.monotonic) -> None:
        """`nvml`: nvidia-ml-py, for GPM's request structure."""
        self._nvml = nvml
        self._seam = seam
        self._clock = clock
        self._samples: dict[tuple[int, int | None], tuple[Any, float]] = {}
        """The newest sample of each GPU (and GPU instance), and when it was taken."""
        self._spare: dict[tuple[int, int | None], Any] = {}
        """The buffer of each one's older sample, read into next."""
        self._supported: dict[int, bool] = {}
        self._nvlink: dict[int, bool] = {}

    def read(self, handle: Any, index: int, gpu_instance: int | None) -> dict[str, float] | None:
        if not self._supports(handle, index):
            return None
        key = (index, gpu_instance)
        kept = self._samples.get(key)
        if kept is not None and self._clock() - kept[1] < GPM_MIN_INTERVAL_S:
            return None  # too soon after the last: the driver would answer 0, not refuse
        sample = self._spare.pop(key, None)
        if sample is None:
            sample = self._seam.query("nvmlGpmSampleAlloc", default=None, scope=DRIVER)
            if sample is None:
                return None
        try:
            if gpu_instance is None:
                self._seam.query("nvmlGpmSampleGet", handle, sample, default=None, scope=Scope(gpu=index))
            else:
                scope = Scope(gpu=index, instance=gpu_instance)
                self._seam.query("nvmlGpmMigSampleGet", handle, gpu_instance, sample, default=None, scope=scope)
        except GpuError:
            self._spare[key] = sample
            raise
        self._samples[key] = (sample, self._clock())
        if kept is None:
            return None
        self._spare[key] = kept[0]
        return self._metrics(kept[0], sample, index)

    def _metrics(self, older: Any, newer: Any, index: int) -> dict[str, float]:
        nvml = self._nvml
        figures = [f for f in GPM_TABLE if not f.nvlink or self._nvlink.get(index, False)]
        request = nvml.c_nvmlGpmMetricsGet_t()
        request.version = nvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(figures)
        request.sample1, request.sample2 = older, newer
        for slot, figure in enumerate(figures):
            request.metrics[slot].metricId = figure.metric_id
        self._seam.query("nvmlGpmMetricsGet", request, default=None, scope=Scope(gpu=index))
        # Each metric has its own status; a value is valid only where it is 0 (NVML_SUCCESS).
        return {
            figure.name: max(0.0, float(request.metrics[slot].value)) * figure.scale
            for slot, figure in enumerate(figures)
            if int(request.metrics[slot].nvmlReturn) == 0
        }

    def _supports(self, handle: Any, index: int) -> bool:
        """Whether the GPU has GPM (Hopper and newer), asked once per session and said once."""
        supported = self._supported.get(index)
        if supported is None:
            answer = self._seam.query("nvmlGpmQueryDeviceSupport", handle, default=None, absent=ANY_ERROR)
            supported = self._supported[index] = bool(answer is not None and answer.isSupportedDevice)
            if not supported:
                log.info("GPU %d has no GPM (Hopper and newer have it): its efficiency families are left out", index)
            links = self._seam.query("nvmlDeviceGetNvLinkState", handle, 0, default=None, absent=ANY_ERROR)
            self._nvlink[index] = links is not None
        return supported

    def free(self) -> None:
        """Free every sample and forget what was learnt of the GPUs (a new session asks again)."""
        for sample in [kept for kept, _ in self._samples.values()] + list(self._spare.values()):
            self._free(sample)
        self._samples.clear()
        self._spare.clear()
        self._supported.clear()
        self._nvlink.clear()

    def _free(self, sample: Any) -> None:
        self._seam.free("nvmlGpmSampleFree", sample)


class XidEventSets:
    """XID events through one NVML event set per GPU, each made at the first take of that GPU in
    an NVML session and holding that GPU alone, so that each GPU's events wait in a queue of
    their own. What nvml.h (NVIDIA/go-nvml pkg/nvml/nvml.h, NVML 13.3.29) says, and this relies on:

    - nvmlDeviceRegisterEvents "starts recording of events on specific device" into the set it
      is given ("All events that occurred before this call are not recorded"); one set may hold
      several devices, which is what made one queue of every GPU's events, in which a storm on
      one GPU kept every other GPU's behind it;
    - nvmlEventSetWait_v2 delivers one event of its set per call ("If some events are ready to be
      delivered at the time of the call, function returns immediately"), NVML_ERROR_TIMEOUT where
      none came in the time (at once, with a zero timeout), and NVML_ERROR_GPU_IS_LOST "if a GPU
      has fallen off the bus": with a set per GPU, a lost GPU's set fails alone;
    - if nvmlDeviceRegisterEvents reports NVML_ERROR_UNKNOWN "event set is in undefined state and
      should be freed"; NOT_SUPPORTED registers none of the types (the GPU is said once and left
      out);
    - nvml.h documents no bound of a set's queue, nor any order across sets.

    A take holds its GPU's lock, never another GPU's: a call hung on GPU 0 holds GPU 0's takes
    alone, and GPU 3's XID 79 is taken beside it (collect/xids.py gives each take a deadline).
    `free` holds `lock` and every GPU's; the backend takes `lock` before nvmlShutdown, so no call
    is ever inside a wait when the session ends (nvml.h says nothing of a wait across
    nvmlShutdown)."""

    def __init__(self, seam: NvmlSession, identified: Callable[[int], tuple[Any, str]]) -> None:
        """`identified(index)`: the GPU's handle and UUID."""
        self._seam = seam
        self._identified = identified
        self.lock = threading.RLock()
        self._gpu_locks: dict[int, threading.Lock] = {}
        """Each GPU's takes, one at a time, by index (made under `lock`)."""
        self._sets: dict[int, tuple[Any, str] | None] = {}
        """By GPU index: its event set and UUID; None for a GPU that reports no XID events."""

    def take(self, index: int, most: int) -> list[XidEvent]:
        """Up to `most` events queued in GPU `index`'s set, without waiting; [] outside a session
        (paused for a driver upgrade, or NVML not initialised yet)."""
        with self.lock:  # only while `free` does not hold it: a GPU's lock is made here
            gpu_lock = self._gpu_locks.setdefault(index, threading.Lock())
        with gpu_lock:
            if not self._seam.in_session():
                return []
            if index not in self._sets:
                self._sets[index] = self._made(index)
            made = self._sets[index]
            if made is None:
                return []
            event_set, uuid = made
            out: list[XidEvent] = []
            for _ in range(most):
                # NVML_ERROR_TIMEOUT: none queued (with a zero timeout, NVML answers at once).
                data = self._seam.query("nvmlEventSetWait_v2", event_set, 0, default=None, absent=_TIMEOUT)
                if data is None:
                    break
                if int(data.eventType) == EVENT_XID:
                    out.append(XidEvent(index, uuid, int(data.eventData)))
            return out

    def _made(self, index: int) -> tuple[Any, str] | None:
        """GPU `index`'s event set, with the GPU registered for XID errors; None where it does not
        report them (said once). A registration that fails frees its set: nothing leaks."""
        handle, uuid = self._identified(index)
        supported = self._seam.query("nvmlDeviceGetSupportedEventTypes", handle, default=0, scope=Scope(gpu=index))
        if not int(supported) & EVENT_XID:
            log.info("GPU %d does not report XID events: vgpu_gpu_xid_errors_total is left out for it", index)
            return None
        event_set = self._seam.query("nvmlEventSetCreate", default=None, scope=DRIVER)
        if event_set is None:
            return None
        try:
            scope = Scope(gpu=index)
            self._seam.query("nvmlDeviceRegisterEvents", handle, EVENT_XID, event_set, default=None, scope=scope)
        except GpuError:
            self._free(event_set)
            raise
        return event_set, uuid

    def free(self) -> None:
        """Every set freed, for the session's end; the next session makes them anew."""
        with self.lock, contextlib.ExitStack() as held:
            for index in sorted(self._gpu_locks):
                held.enter_context(self._gpu_locks[index])  # after each GPU's take in progress
            for made in self._sets.values():
                if made is not None:
                    self._free(made[0])
            self._sets.clear()

    def _free(self, event_set: Any) -> None:
        self._seam.free("nvmlEventSetFree", event_set)


def _what(figures: tuple[HealthFigure, ...], call: str) -> str:
    """What a GPU without `call` does not report: a figure, or the call that several come from."""
    return f"its {figures[0].name.replace('.', ' ')}" if len(figures) == 1 else call


def _families(figures: tuple[HealthFigure, ...]) -> str:
    """The families of `figures`, by their names in a scrape, as the log says they are left out."""
    names = [figure.prometheus_name for figure in figures]
    return f"{names[0]} is" if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]} are"
