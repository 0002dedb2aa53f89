"""A GPU's health, its GPM figures and its XID events, from NVML (gpu/nvml.py's session).

Each read goes through the backend's `query`, so a figure this driver or GPU does not have is
noted once for the NVML session and not asked again, and a lost session is seen as everywhere
else. Every call below answers an unprivileged process (measured on an H200 with driver 580 as
uid 0 with no capability and as uid 65534: issue #39). The calls and units are nvml.h's
(NVIDIA/go-nvml pkg/nvml/nvml.h, CUDA 13.3): clocks in MHz, power in mW, the violation
counters in ns, GPM utilizations in percent and its byte rates in MiB/s.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from otel_vgpu.gpu.backend import ErrorCode, GpuError, XidEvent
from otel_vgpu.gpu.device_figures import GPM_MIN_INTERVAL_S, GPM_TABLE

log = logging.getLogger(__name__)

# NVML field IDs (nvml.h): memory temperature, and the nanoseconds the clocks were held down
# by the power cap and by heat (the fields NVML names in place of the deprecated
# nvmlDeviceGetViolationStatus).
FIELD_MEMORY_TEMP = 82
FIELD_POWER_CAP_NS = 74
FIELD_THERMAL_NS = 269
FIELDS = {FIELD_MEMORY_TEMP: ("memory.temperature", 1.0), FIELD_POWER_CAP_NS: ("power.violation", 1e-9)}
FIELDS[FIELD_THERMAL_NS] = ("thermal.violation", 1e-9)
# nvmlValueType_t to the member of nvmlValue_t that holds it.
VALUE_MEMBERS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}
# nvmlClockType_t, nvmlMemoryErrorType_t and nvmlEccCounterType_t (nvml.h).
CLOCK_SM, CLOCK_MEM = 1, 2
ECC_CORRECTED, ECC_UNCORRECTED, ECC_VOLATILE = 0, 1, 0
# nvmlEventTypeXidCriticalError.
EVENT_XID = 0x8

_TIMEOUT = frozenset({ErrorCode.TIMEOUT})

Query = Callable[..., Any]
"""The backend's `query`: a call, or its default where NVML lacks it (gpu/nvml.py)."""


def read_health(
    nvml: Any, handle: Any, index: int, query: Query, session: dict[tuple[int, str], Any]
) -> dict[str, float]:
    """GPU `index`'s health figures now; each one the GPU or driver lacks is left out.
    `session` keeps what holds for the NVML session (the backend clears it with its handles)."""

    def ask(figure: str, function: Any, *args: Any) -> Any:
        return query(
            function,
            handle,
            *args,
            default=None,
            remember=(index, figure),
            say=f"GPU {index} does not report its {figure.replace('.', ' ')}: vgpu_gpu_{_snake(figure)} is left out",
        )

    out: dict[str, float] = {}
    sm, mem = (
        ask("sm.clock", nvml.nvmlDeviceGetClockInfo, CLOCK_SM),
        ask("memory.clock", nvml.nvmlDeviceGetClockInfo, CLOCK_MEM),
    )
    out |= {} if sm is None else {"sm.clock": float(sm) * 1e6}
    out |= {} if mem is None else {"memory.clock": float(mem) * 1e6}
    temperature = getattr(nvml, "nvmlDeviceGetTemperatureV", None)
    celsius = (
        ask("temperature", temperature, 0)
        if temperature is not None
        else ask("temperature", nvml.nvmlDeviceGetTemperature, 0)
    )
    out |= {} if celsius is None else {"temperature": float(celsius)}
    for figure, function in (
        ("power", nvml.nvmlDeviceGetPowerUsage),
        ("power.limit", nvml.nvmlDeviceGetEnforcedPowerLimit),
    ):
        milliwatts = ask(figure, function)
        out |= {} if milliwatts is None else {figure: float(milliwatts) / 1000.0}
    replays = ask("pcie.replays", nvml.nvmlDeviceGetPcieReplayCounter)
    out |= {} if replays is None else {"pcie.replays": float(replays)}
    reasons_call = (
        getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or nvml.nvmlDeviceGetCurrentClocksThrottleReasons
    )
    reasons = ask("clock.event.reasons", reasons_call)
    out |= {} if reasons is None else {"clock.event.reasons": float(reasons)}
    out |= _fields(nvml, handle, index, query)
    out |= _ecc(nvml, index, ask, session)
    rows = ask("remapped.rows", nvml.nvmlDeviceGetRemappedRows)
    if rows is not None:
        correctable, uncorrectable, pending, failure = (float(value) for value in rows)
        out |= {
            "remapped.rows.correctable": correctable,
            "remapped.rows.uncorrectable": uncorrectable,
            "remapped.rows.pending": pending,
            "remapped.rows.failure": failure,
        }
    return out


def _fields(nvml: Any, handle: Any, index: int, query: Query) -> dict[str, float]:
    """The figures NVML gives as field values: one call, each field with its own status."""
    values = query(nvml.nvmlDeviceGetFieldValues, handle, list(FIELDS), default=(), remember=(index, "fields"))
    out: dict[str, float] = {}
    for value in values:
        figure, scale = FIELDS.get(int(value.fieldId), ("", 1.0))
        if figure and int(value.nvmlReturn) == 0 and int(value.valueType) in VALUE_MEMBERS:
            out[figure] = float(getattr(value.value, VALUE_MEMBERS[int(value.valueType)])) * scale
    return out


def _ecc(nvml: Any, index: int, ask: Callable[..., Any], session: dict[tuple[int, str], Any]) -> dict[str, float]:
    """The volatile ECC totals, where ECC is on (nvmlDeviceGetTotalEccErrors requires it).
    The mode is asked once an NVML session: "Changing ECC modes requires a reboot" (nvml.h,
    nvmlDeviceGetEccMode), and a session begins at every start and every driver reload. A mode
    a GPU reset applied while the session lasts is seen at the next one; until then a count
    NVML no longer gives is left out, as any figure it lacks. At 0.16 ms on an H200 the mode
    was the dearest health call after the PCIe replay counter (bench/results/h200-health.md)."""
    if (index, "ecc") not in session:
        session[(index, "ecc")] = ask("ecc", nvml.nvmlDeviceGetEccMode)
    mode = session[(index, "ecc")]
    if mode is None or int(mode[0]) != 1:
        return {}
    out: dict[str, float] = {}
    for figure, kind in (("ecc.corrected", ECC_CORRECTED), ("ecc.uncorrected", ECC_UNCORRECTED)):
        count = ask(figure, nvml.nvmlDeviceGetTotalEccErrors, kind, ECC_VOLATILE)
        out |= {} if count is None else {figure: float(count)}
    return out


def _snake(figure: str) -> str:
    return figure.replace(".", "_")


class Gpm:
    """GPM samples, two buffers per GPU (and MIG GPU instance), as nvml.h asks ("at least two
    of these buffers"): each read takes a sample into the buffer the last read let go, returns
    the figures between it and the one before (nvmlGpmMetricsGet), and keeps the older buffer
    for the next read, so that no window pays NVML's allocation and free. Samples are NVML
    allocations: `free` must run before nvmlShutdown."""

    def __init__(self, nvml: Any, query: Query, clock: Callable[[], float] = time.monotonic) -> None:
        self._nvml = nvml
        self._query = query
        self._clock = clock
        self._samples: dict[tuple[int, int | None], tuple[Any, float]] = {}
        """The newest sample of each GPU (and GPU instance), and when it was taken."""
        self._spare: dict[tuple[int, int | None], Any] = {}
        """The buffer of each one's older sample, read into next."""
        self._supported: dict[int, bool] = {}
        self._nvlink: dict[int, bool] = {}

    def read(self, handle: Any, index: int, gpu_instance: int | None) -> dict[str, float] | None:
        nvml = self._nvml
        if not self._supports(handle, index):
            return None
        key = (index, gpu_instance)
        kept = self._samples.get(key)
        if kept is not None and self._clock() - kept[1] < GPM_MIN_INTERVAL_S:
            return None  # too soon after the last: the driver would answer 0, not refuse
        sample = self._spare.pop(key, None)
        if sample is None:
            sample = self._query(nvml.nvmlGpmSampleAlloc, default=None, remember="gpm")
            if sample is None:
                return None
        try:
            if gpu_instance is None:
                self._query(nvml.nvmlGpmSampleGet, handle, sample, default=None, remember=(index, "gpm"))
            else:
                self._query(nvml.nvmlGpmMigSampleGet, handle, gpu_instance, sample, default=None, remember=key)
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
        self._query(nvml.nvmlGpmMetricsGet, request, default=None, remember=(index, "gpm"))
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
            nvml = self._nvml
            function = getattr(nvml, "nvmlGpmQueryDeviceSupport", None)
            answer = (
                None if function is None else self._query(function, handle, default=None, absent=frozenset(ErrorCode))
            )
            supported = self._supported[index] = bool(answer is not None and answer.isSupportedDevice)
            if not supported:
                log.info("GPU %d has no GPM (Hopper and newer have it): its efficiency families are left out", index)
            links = self._query(nvml.nvmlDeviceGetNvLinkState, handle, 0, default=None, absent=frozenset(ErrorCode))
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
        self._query(self._nvml.nvmlGpmSampleFree, sample, default=None, absent=frozenset(ErrorCode))


class XidWatch:
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

    A take holds `lock`; the backend takes it before nvmlShutdown, so no call is ever inside a
    wait when the session ends (nvml.h says nothing of a wait across nvmlShutdown)."""

    def __init__(
        self,
        nvml: Any,
        query: Query,
        identified: Callable[[int], tuple[Any, str]],
        in_session: Callable[[], bool],
    ) -> None:
        """`identified(index)`: the GPU's handle and UUID."""
        self._nvml = nvml
        self._query = query
        self._identified = identified
        self._in_session = in_session
        self.lock = threading.RLock()
        self._sets: dict[int, tuple[Any, str] | None] = {}
        """By GPU index: its event set and UUID; None for a GPU that reports no XID events."""

    def take(self, index: int, most: int) -> list[XidEvent]:
        """Up to `most` events queued in GPU `index`'s set, without waiting; [] outside a session
        (paused for a driver upgrade, or NVML not initialised yet)."""
        with self.lock:
            if not self._in_session():
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
                data = self._query(self._nvml.nvmlEventSetWait_v2, event_set, 0, default=None, absent=_TIMEOUT)
                if data is None:
                    break
                if int(data.eventType) == EVENT_XID:
                    out.append(XidEvent(index, uuid, int(data.eventData)))
            return out

    def _made(self, index: int) -> tuple[Any, str] | None:
        """GPU `index`'s event set, with the GPU registered for XID errors; None where it does not
        report them (said once). A registration that fails frees its set: nothing leaks."""
        nvml = self._nvml
        handle, uuid = self._identified(index)
        supported = self._query(nvml.nvmlDeviceGetSupportedEventTypes, handle, default=0, remember=(index, "events"))
        if not int(supported) & EVENT_XID:
            log.info("GPU %d does not report XID events: vgpu_gpu_xid_errors_total is left out for it", index)
            return None
        event_set = self._query(nvml.nvmlEventSetCreate, default=None, remember="events")
        if event_set is None:
            return None
        try:
            self._query(
                nvml.nvmlDeviceRegisterEvents, handle, EVENT_XID, event_set, default=None, remember=(index, "xid")
            )
        except GpuError:
            self._free(event_set)
            raise
        return event_set, uuid

    def free(self) -> None:
        """Every set freed, for the session's end; the next session makes them anew."""
        with self.lock:
            for made in self._sets.values():
                if made is not None:
                    self._free(made[0])
            self._sets.clear()

    def _free(self, event_set: Any) -> None:
        self._query(self._nvml.nvmlEventSetFree, event_set, default=None, absent=frozenset(ErrorCode))
