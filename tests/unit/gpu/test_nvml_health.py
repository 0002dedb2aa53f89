"""Health figures, GPM and XID events through the NVML backend, against a double of
nvidia-ml-py's module that answers with nvidia-ml-py's own structures (the field values'
and GPM's ctypes structs) and raises its own errors, as NVML does."""

from __future__ import annotations

import functools
import logging
import threading
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from otel_vgpu.config import DEFAULT_BACKOFF
from otel_vgpu.gpu import nvml as nvml_module
from otel_vgpu.gpu.backend import ABSENT, ErrorCode, FailedRead, GpuError, XidEvent
from otel_vgpu.gpu.device_figures import (
    CLOCK_MEM,
    CLOCK_SM,
    ECC_CORRECTED,
    ECC_UNCORRECTED,
    ECC_VOLATILE,
    FIELD_MEMORY_TEMP,
    FIELD_POWER_CAP_NS,
    FIELD_THERMAL_NS,
    HEALTH_FIGURES,
    HEALTH_TABLE,
    TEMPERATURE_GPU,
    TUPLES,
    HealthFigure,
)
from otel_vgpu.gpu.nvml import NvmlBackend
from otel_vgpu.gpu.nvml_health import HEALTH_BY_READ, READS, grouped, read_health
from otel_vgpu.gpu.nvml_session import NvmlSession
from testkit.agent import wait_until

pytestmark = pytest.mark.unit


class HealthNvml:
    """H200-like GPUs (the health calls and GPM of GPU 0) with an encoder, and event sets: each
    set queues the events of the GPUs registered in it, as nvml.h has it."""

    NVMLError = pynvml.NVMLError
    c_nvmlGpmMetricsGet_t = pynvml.c_nvmlGpmMetricsGet_t
    NVML_GPM_METRICS_GET_VERSION = pynvml.NVML_GPM_METRICS_GET_VERSION

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.unsupported: set[str] = set()
        self.failing: dict[str, int] = {}
        """By call, the error NVML answers it with."""
        self.field_status = {FIELD_MEMORY_TEMP: 0, FIELD_POWER_CAP_NS: 0, FIELD_THERMAL_NS: 0}
        self.ecc_mode = 1
        self.gpm_supported = 1
        self.samples_alive: set[int] = set()
        self.kept: list[Any] = []
        self.metric_status: dict[int, int] = {}
        self.event_sets = 0
        self.registered: dict[str, list[str]] = {}
        """By event set, the GPUs (handles) registered in it."""
        self.queued: dict[str, list[Any]] = {}
        """By event set, what it holds to deliver."""
        self.lost_sets: set[str] = set()
        self.hung_sets: dict[str, threading.Event] = {}
        """By event set, what its waits hang on until it is set, as a driver's call may."""
        self.failing_registration: set[str] = set()
        self.without_xid_events: set[str] = set()
        self.shutdown_with_alive: set[int] | None = None

    def _ask(self, name: str) -> None:
        self.calls.append(name)
        if name in self.unsupported:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if name in self.failing:
            raise pynvml.NVMLError(self.failing[name])

    # the session
    def nvmlInit(self) -> None:
        self.calls.append("init")

    def nvmlShutdown(self) -> None:
        self.calls.append("shutdown")
        self.shutdown_with_alive = set(self.samples_alive)

    def nvmlDeviceGetCount(self) -> int:
        return 1

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
        return f"handle{index}"

    def nvmlDeviceGetUUID(self, handle: str) -> str:
        return "GPU-h200" if handle == "handle0" else f"GPU-h200-{handle}"

    def nvmlDeviceGetName(self, handle: str) -> str:
        return "NVIDIA H200"

    def nvmlDeviceGetComputeRunningProcesses(self, handle: str) -> list[Any]:
        return []

    nvmlDeviceGetGraphicsRunningProcesses = nvmlDeviceGetComputeRunningProcesses

    def nvmlDeviceGetIndex(self, handle: str) -> int:
        return int(handle.removeprefix("handle"))

    # health
    def nvmlDeviceGetClockInfo(self, handle: str, clock: int) -> int:
        self._ask(f"clock{clock}")
        return {1: 1980, 2: 3201}[clock]

    def nvmlDeviceGetTemperatureV(self, handle: str, sensor: int) -> int:
        self._ask("temperature")
        return 38

    def nvmlDeviceGetPowerUsage(self, handle: str) -> int:
        self._ask("power")
        return 79118

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: str) -> int:
        self._ask("limit")
        return 700000

    def nvmlDeviceGetPcieReplayCounter(self, handle: str) -> int:
        self._ask("replays")
        return 3

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: str) -> int:
        self._ask("reasons")
        return 0x20 | 0x1

    def nvmlDeviceGetFieldValues(self, handle: str, ids: list[int]) -> Any:
        self._ask("fields")
        values = (pynvml.c_nvmlFieldValue_t * len(ids))()
        numbers = {FIELD_MEMORY_TEMP: 41, FIELD_POWER_CAP_NS: 2_500_000_000, FIELD_THERMAL_NS: 0}
        for slot, field_id in enumerate(ids):
            values[slot].fieldId = field_id
            values[slot].nvmlReturn = self.field_status[field_id]
            values[slot].valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
            values[slot].value.ullVal = numbers[field_id]
        return values

    def nvmlDeviceGetEccMode(self, handle: str) -> list[int]:
        self._ask("ecc")
        return [self.ecc_mode, self.ecc_mode]

    def nvmlDeviceGetTotalEccErrors(self, handle: str, kind: int, counter: int) -> int:
        self._ask(f"ecc{kind}")
        assert counter == pynvml.NVML_VOLATILE_ECC
        return {pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED: 7, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED: 1}[kind]

    def nvmlDeviceGetRemappedRows(self, handle: str) -> tuple[int, int, int, int]:
        self._ask("remapped")
        return (2, 0, 1, 0)

    def nvmlDeviceGetEncoderUtilization(self, handle: str) -> list[int]:
        return [0, 100000]  # NVML's word that the GPU has an encoder, where it has no instance profile

    def nvmlDeviceGetEncoderStats(self, handle: str) -> tuple[int, int, int]:
        self._ask("encoder_stats")
        return (3, 30, 1200)

    # GPM
    def nvmlGpmQueryDeviceSupport(self, handle: str) -> Any:
        self._ask("gpm_support")
        return SimpleNamespace(isSupportedDevice=self.gpm_supported)

    def nvmlDeviceGetNvLinkState(self, handle: str, link: int) -> int:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)  # an H200 of the lent kind: no NVLink

    def nvmlGpmSampleAlloc(self) -> Any:
        sample = pynvml.c_nvmlGpmSample_t()  # what nvidia-ml-py gives: the struct nvmlGpmMetricsGet_t holds
        self.samples_alive.add(id(sample))
        self.kept.append(sample)
        return sample

    def nvmlGpmSampleFree(self, sample: Any) -> None:
        self.samples_alive.discard(id(sample))

    def nvmlGpmSampleGet(self, handle: str, sample: Any) -> Any:
        self._ask("gpm_sample")
        return sample

    def nvmlGpmMetricsGet(self, request: Any) -> Any:
        self._ask("gpm_metrics")
        values = {5: 93.6, 10: 16.0, 2: 14.0, 20: 2.0}
        for slot in range(request.numMetrics):
            metric = request.metrics[slot]
            metric.nvmlReturn = self.metric_status.get(metric.metricId, 0)
            metric.value = values.get(metric.metricId, 0.0)
        return request

    # events
    def happen(self, handle: str, event_type: int, data: int, times: int = 1) -> None:
        """An event on a GPU: queued in every set that GPU is registered in."""
        for event_set, handles in self.registered.items():
            if handle in handles:
                event = SimpleNamespace(device=handle, eventType=event_type, eventData=data)
                self.queued[event_set] += [event] * times

    def nvmlEventSetCreate(self) -> str:
        self.event_sets += 1
        name = f"set{self.event_sets}"
        self.registered[name], self.queued[name] = [], []
        return name

    def nvmlDeviceGetSupportedEventTypes(self, handle: str) -> int:
        return 0xFF97 if handle in self.without_xid_events else 0xFF9F

    def nvmlDeviceRegisterEvents(self, handle: str, types: int, event_set: str) -> None:
        self.calls.append(f"register{types:#x} {handle} {event_set}")
        if handle in self.failing_registration:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)
        self.registered[event_set].append(handle)

    def nvmlEventSetWait_v2(self, event_set: str, timeout_ms: int) -> Any:
        self.calls.append(f"wait {event_set}")
        assert timeout_ms == 0  # never blocks in NVML
        if event_set in self.hung_sets:
            self.hung_sets[event_set].wait()
        if event_set in self.lost_sets:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        if not self.queued[event_set]:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
        return self.queued[event_set].pop(0)

    def nvmlEventSetFree(self, event_set: str) -> None:
        self.calls.append(f"free {event_set}")
        del self.registered[event_set]


@pytest.fixture
def nvml() -> HealthNvml:
    return HealthNvml()


def backend(nvml: HealthNvml, clock: list[float] | None = None) -> NvmlBackend:
    times = clock or [0.0]
    return NvmlBackend(nvml, clock=lambda: times[0])


def test_every_health_figure_in_its_unit(nvml: HealthNvml) -> None:
    reading = backend(nvml).health(0)
    # The double answers every call of the table: the reading has each of its figures, no other.
    assert sorted(reading.figures) == sorted(HEALTH_FIGURES) and reading.failed == ()
    assert reading.figures == {
        "sm.clock": 1980e6,
        "memory.clock": 3201e6,
        "temperature": 38.0,
        "memory.temperature": 41.0,
        "power": pytest.approx(79.118),
        "power.limit": 700.0,
        "pcie.replays": 3.0,
        "clock.event.reasons": float(0x21),
        "power.violation": pytest.approx(2.5),
        "thermal.violation": 0.0,
        "ecc.corrected": 7.0,
        "ecc.uncorrected": 1.0,
        "remapped.rows.correctable": 2.0,
        "remapped.rows.uncorrectable": 0.0,
        "remapped.rows.pending": 1.0,
        "remapped.rows.failure": 0.0,
        "encoder.sessions": 3.0,
    }


def test_each_figures_read_is_a_call_nvidia_ml_py_has_and_a_read_the_backend_knows() -> None:
    for figure in HEALTH_TABLE:
        for name in (figure.call, *figure.older):
            assert callable(getattr(pynvml, name, None)), f"{figure.name}: nvidia-ml-py has no {name}"
        assert figure.read in READS, figure.name
        assert figure.scale >= 1 or figure.scale * round(1 / figure.scale) == pytest.approx(1.0), figure.name
    # The arguments are nvml.h's, as nvidia-ml-py names them.
    assert (CLOCK_SM, CLOCK_MEM, TEMPERATURE_GPU) == (
        pynvml.NVML_CLOCK_SM,
        pynvml.NVML_CLOCK_MEM,
        pynvml.NVML_TEMPERATURE_GPU,
    )
    assert (ECC_CORRECTED, ECC_UNCORRECTED, ECC_VOLATILE) == (
        pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED,
        pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
        pynvml.NVML_VOLATILE_ECC,
    )
    assert (FIELD_MEMORY_TEMP, FIELD_POWER_CAP_NS, FIELD_THERMAL_NS) == (
        pynvml.NVML_FI_DEV_MEMORY_TEMP,
        pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP,
        pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN,
    )
    # A read makes one call for its figures, which NVML lacks alike: the figures of one call and
    # arguments each take their element of its answer, by a name the answer has.
    for read, figures in HEALTH_BY_READ:
        assert len({(figure.call, figure.absent, figure.older) for figure in figures}) == 1, read
        assert read or len(figures) == 1 or all(figure.take for figure in figures), figures
        for figure in figures:
            assert not figure.take or figure.call not in TUPLES or figure.take in TUPLES[figure.call], figure.name


def test_a_scale_under_one_divides_so_that_the_figure_rounds_once() -> None:
    # 9 mW times 1e-3 is 0.009000000000000001 W; 7 ns times 1e-9, 7.000000000000001e-09 s.
    assert HealthFigure("x", "W", "", scale=1e-3).published(9.0) == 0.009
    assert HealthFigure("x", "s", "", scale=1e-9).published(7.0) == 7e-9
    assert HealthFigure("x", "Hz", "", scale=1e6).published(1980.0) == 1980e6


class FanNvml(HealthNvml):
    """An H200 asked for its fan: nvmlDeviceGetNumFans answers 0 there, and
    nvmlDeviceGetFanSpeed_v2(handle, 0) INVALID_ARGUMENT; `percent` where a GPU has one."""

    def __init__(self) -> None:
        super().__init__()
        self.percent: int | None = None

    def nvmlDeviceGetFanSpeed_v2(self, handle: str, fan: int) -> int:
        self._ask("fan")
        if self.percent is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self.percent


def fan(absent: frozenset[ErrorCode]) -> HealthFigure:
    return HealthFigure(
        "fan.speed",
        "1",
        "",
        prometheus_name="vgpu_gpu_fan_speed_ratio",
        call="nvmlDeviceGetFanSpeed_v2",
        args=(0,),
        scale=0.01,
        absent=absent,
    )


def session_of(nvml: HealthNvml) -> NvmlSession:
    seam = NvmlSession(nvml, lambda: 0.0, DEFAULT_BACKOFF, let_go=lambda: None, forget=lambda: None)
    seam.initialise()
    return seam


def test_a_figure_says_which_answers_mean_the_gpu_lacks_it(caplog: pytest.LogCaptureFixture) -> None:
    nvml = FanNvml()
    seam, kept = session_of(nvml), dict[tuple[int, str], Any]()
    # Where its entry takes INVALID_ARGUMENT for an absence: left out, said once, asked once a session.
    lacking = grouped((fan(ABSENT | {ErrorCode.INVALID_ARGUMENT}),))
    with caplog.at_level(logging.INFO):
        readings = [read_health("handle0", 0, seam, kept, lacking) for _ in range(3)]
    assert [(r.figures, r.failed) for r in readings] == [({}, ())] * 3
    assert nvml.calls.count("fan") == 1
    assert [r.message for r in caplog.records] == [
        "GPU 0 does not report its fan speed: vgpu_gpu_fan_speed_ratio is left out"
    ]
    # Where it does not: a failure of that read, asked again at the next.
    failing = grouped((fan(ABSENT),))
    second = [read_health("handle1", 1, seam, kept, failing) for _ in range(2)]
    assert [[(f.figures, f.error.code) for f in r.failed] for r in second] == [
        [(("fan.speed",), ErrorCode.INVALID_ARGUMENT)]
    ] * 2
    assert nvml.calls.count("fan") == 3
    # A GPU with a fan: percent to 0-1.
    nvml.percent = 30
    assert read_health("handle1", 1, seam, kept, failing).figures == {"fan.speed": 0.3}


class ProcessNvml(FanNvml):
    """A GPU asked for figures that are part of an answer: fields of nvmlDeviceGetMemoryInfo's
    struct, elements of nvmlDeviceGetEncoderStats' tuple (sessionCount, averageFps, averageLatency)."""

    def nvmlDeviceGetMemoryInfo(self, handle: str) -> Any:
        self._ask("memory")
        return SimpleNamespace(total=80, free=30, used=50)

    def nvmlDeviceGetEncoderStats(self, handle: str) -> tuple[int, int, int]:
        self._ask("encoder_stats")
        return (2, 30, 1200)


def element(name: str, call: str, take: str, engine: str = "") -> HealthFigure:
    return HealthFigure(name, "By", "", prometheus_name=f"vgpu_gpu_{name}", call=call, take=take, engine=engine)


def test_figures_of_one_call_take_their_elements_of_its_answer_from_one_call(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = ProcessNvml()
    seam, kept = session_of(nvml), dict[tuple[int, str], Any]()
    monkeypatch.setitem(TUPLES, "nvmlDeviceGetEncoderStats", ("sessionCount", "averageFps", "averageLatency"))
    figures = (
        element("free", "nvmlDeviceGetMemoryInfo", "free"),
        element("used", "nvmlDeviceGetMemoryInfo", "used"),
        element("sessions", "nvmlDeviceGetEncoderStats", "sessionCount"),
        element("latency", "nvmlDeviceGetEncoderStats", "averageLatency"),
    )
    reading = read_health("handle0", 0, seam, kept, grouped(figures))
    assert reading.figures == {"free": 30.0, "used": 50.0, "sessions": 2.0, "latency": 1200.0}
    assert nvml.calls.count("memory") == 1 and nvml.calls.count("encoder_stats") == 1


def test_a_figure_of_an_engine_the_gpu_lacks_is_left_out_said_once_and_not_asked(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # NVML answers an encoder's calls on a GPU without one as if it were idle: the agent asks
    # nothing of it, as the engine's own families are left out there.
    nvml = ProcessNvml()
    seam, kept = session_of(nvml), dict[tuple[int, str], Any]()
    monkeypatch.setitem(TUPLES, "nvmlDeviceGetEncoderStats", ("sessionCount", "averageFps", "averageLatency"))
    sessions = grouped((element("sessions", "nvmlDeviceGetEncoderStats", "sessionCount", engine="encoder"),))
    with caplog.at_level(logging.INFO):
        lacking = [
            read_health("handle0", 0, seam, kept, sessions, engines=lambda: frozenset({"decoder"})) for _ in range(2)
        ]
    assert [(r.figures, r.failed) for r in lacking] == [({}, ())] * 2 and "encoder_stats" not in nvml.calls
    assert [r.message for r in caplog.records] == ["GPU 0 has no encoder: vgpu_gpu_sessions is left out"]
    having = read_health("handle1", 1, seam, kept, sessions, engines=lambda: frozenset({"encoder"}))
    assert having.figures == {"sessions": 2.0}


class EncodingNvml(ProcessNvml):
    """A GPU with no GPU-instance profiles (an L4's kind), which has an encoder where NVML
    answers its utilization (`encoder`)."""

    def __init__(self, encoder: bool) -> None:
        super().__init__()
        self.encoder = encoder

    def nvmlDeviceGetEncoderUtilization(self, handle: str) -> list[int]:
        if not self.encoder:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return [0, 100000]


@pytest.mark.parametrize("encoder", [False, True])
def test_the_backend_reads_an_engines_figure_where_the_gpu_has_the_engine(
    monkeypatch: pytest.MonkeyPatch, encoder: bool
) -> None:
    monkeypatch.setitem(TUPLES, "nvmlDeviceGetEncoderStats", ("sessionCount", "averageFps", "averageLatency"))
    sessions = grouped((element("sessions", "nvmlDeviceGetEncoderStats", "sessionCount", engine="encoder"),))
    monkeypatch.setattr(nvml_module, "read_health", functools.partial(read_health, reads=sessions))
    nvml = EncodingNvml(encoder)
    assert backend(nvml).health(0).figures == ({"sessions": 2.0} if encoder else {})
    assert nvml.calls.count("encoder_stats") == int(encoder)


def test_a_read_that_fails_costs_its_figures_that_reading_alone(nvml: HealthNvml) -> None:
    nvml.failing = {
        "power": pynvml.NVML_ERROR_UNKNOWN,
        "ecc1": pynvml.NVML_ERROR_UNKNOWN,
        "remapped": pynvml.NVML_ERROR_NO_PERMISSION,
    }
    gpu = backend(nvml)
    reading = gpu.health(0)
    rows = tuple(f"remapped.rows.{what}" for what in ("correctable", "uncorrectable", "pending", "failure"))
    assert set(HEALTH_FIGURES) - set(reading.figures) == {"power", "ecc.uncorrected", *rows}
    # One failure for each read that failed: the four rows came from one call.
    assert [(f.figures, f.error.code) for f in reading.failed] == [
        (("power",), ErrorCode.UNKNOWN),
        (("ecc.uncorrected",), ErrorCode.UNKNOWN),
        (rows, ErrorCode.NO_PERMISSION),
    ]
    assert all(isinstance(f, FailedRead) for f in reading.failed)
    # No absence was taken from them: the next reading asks again, and has them.
    nvml.failing.clear()
    again = gpu.health(0)
    assert sorted(again.figures) == sorted(HEALTH_FIGURES) and again.failed == ()


@pytest.mark.parametrize("code", [pynvml.NVML_ERROR_GPU_IS_LOST, pynvml.NVML_ERROR_UNINITIALIZED])
def test_a_lost_gpu_or_session_fails_the_whole_reading(nvml: HealthNvml, code: int) -> None:
    nvml.failing = {"power": code}
    gpu = backend(nvml)
    with pytest.raises(GpuError) as caught:
        gpu.health(0)
    assert caught.value.code in {ErrorCode.GPU_IS_LOST, ErrorCode.UNINITIALIZED}
    assert "limit" not in nvml.calls, "no figure is asked after it"
    assert gpu.ready is (code == pynvml.NVML_ERROR_GPU_IS_LOST), "a lost session is let go of"


def test_what_the_gpu_lacks_is_left_out_said_once_and_not_asked_again(
    nvml: HealthNvml, caplog: pytest.LogCaptureFixture
) -> None:
    nvml.unsupported = {"replays", "remapped"}
    nvml.field_status[FIELD_MEMORY_TEMP] = pynvml.NVML_ERROR_NOT_SUPPORTED
    gpu = backend(nvml)
    with caplog.at_level(logging.INFO):
        first, second = gpu.health(0).figures, gpu.health(0).figures
    assert first == second
    assert "pcie.replays" not in first and "memory.temperature" not in first and "remapped.rows.failure" not in first
    assert nvml.calls.count("replays") == 1 and nvml.calls.count("remapped") == 1
    said = [r.message for r in caplog.records if "does not report" in r.message]
    assert len(said) == 2 and "GPU 0 does not report its pcie replays: vgpu_gpu_pcie_replays_total is left out" in said
    assert (
        "GPU 0 does not report nvmlDeviceGetRemappedRows: vgpu_gpu_remapped_rows_correctable_total, "
        "vgpu_gpu_remapped_rows_uncorrectable_total, vgpu_gpu_remapped_rows_pending and "
        "vgpu_gpu_remapped_rows_failure are left out"
    ) in said


def test_the_ecc_mode_is_asked_once_a_session(nvml: HealthNvml) -> None:
    gpu = backend(nvml)
    for _ in range(3):
        assert "ecc.corrected" in gpu.health(0).figures
    assert nvml.calls.count("ecc") == 1 and nvml.calls.count("ecc0") == 3
    gpu.release()  # a driver upgrade's pause: the next session asks again
    gpu.resume()
    gpu.device_count()  # the sweep's first call initialises the new session
    nvml.ecc_mode = 0
    assert "ecc.corrected" not in gpu.health(0).figures
    assert nvml.calls.count("ecc") == 2


def test_ecc_off_gives_no_counts_and_asks_for_none(nvml: HealthNvml) -> None:
    nvml.ecc_mode = 0
    figures = backend(nvml).health(0).figures
    assert "ecc.corrected" not in figures and "ecc.uncorrected" not in figures
    assert not [c for c in nvml.calls if c.startswith("ecc") and c != "ecc"]


def test_gpm_gives_the_figures_between_two_samples_and_frees_every_sample(nvml: HealthNvml) -> None:
    clock = [0.0]
    gpu = backend(nvml, clock)
    assert gpu.gpm(0) is None  # the first sample opens the window
    clock[0] = 10.0
    figures = gpu.gpm(0)
    assert figures is not None
    assert figures["tensor.active"] == pytest.approx(0.936)
    assert figures["dram.active"] == pytest.approx(0.16)
    assert figures["pcie.transmit"] == pytest.approx(2.0 * 1024 * 1024)
    assert "nvlink.transmit" not in figures  # no NVLink: not even asked
    assert len(nvml.samples_alive) == 2  # two buffers: the newer sample, and the older to read into next
    for window in range(2, 5):
        clock[0] = 10.0 * window
        assert gpu.gpm(0) is not None
    assert len(nvml.kept) == 2 and len(nvml.samples_alive) == 2  # later windows allocate nothing
    gpu.release()
    assert nvml.shutdown_with_alive == set()  # freed before nvmlShutdown


def test_a_metric_nvml_refuses_is_left_out_and_reads_too_close_wait(nvml: HealthNvml) -> None:
    clock = [0.0]
    gpu = backend(nvml, clock)
    nvml.metric_status[5] = pynvml.NVML_ERROR_INVALID_ARGUMENT
    gpu.gpm(0)
    clock[0] = 0.05  # under GPM's 100 ms: the driver would answer 0, so the agent does not ask
    assert gpu.gpm(0) is None and nvml.calls.count("gpm_sample") == 1
    clock[0] = 10.0
    figures = gpu.gpm(0)
    assert figures is not None and "tensor.active" not in figures and "dram.active" in figures


def test_a_gpu_without_gpm_is_said_once_and_never_sampled(nvml: HealthNvml, caplog: pytest.LogCaptureFixture) -> None:
    nvml.gpm_supported = 0
    gpu = backend(nvml)
    with caplog.at_level(logging.INFO):
        assert gpu.gpm(0) is None and gpu.gpm(0) is None
    assert "gpm_sample" not in nvml.calls and nvml.calls.count("gpm_support") == 1
    assert len([r for r in caplog.records if "has no GPM" in r.message]) == 1


def test_each_gpus_xid_events_come_from_its_own_event_set_freed_before_shutdown(nvml: HealthNvml) -> None:
    gpu = backend(nvml)
    assert gpu.xid_events(0, 8) == [] and gpu.xid_events(1, 8) == []  # none queued: NVML's timeout
    # One set per GPU, each holding that GPU alone.
    assert nvml.registered == {"set1": ["handle0"], "set2": ["handle1"]}
    nvml.happen("handle0", 0x8, 13, times=100)  # a storm on GPU 0...
    nvml.happen("handle1", 0x8, 79)  # ...queued before GPU 1's XID 79
    nvml.happen("handle1", 0x4, 0)  # a P-state change: not counted
    assert gpu.xid_events(1, 8) == [XidEvent(1, "GPU-h200-handle1", 79)]  # not behind GPU 0's storm
    assert gpu.xid_events(0, 8) == [XidEvent(0, "GPU-h200", 13)] * 8  # at most what was asked
    assert len(nvml.queued["set1"]) == 92  # the rest wait in GPU 0's own queue
    gpu.release()
    assert nvml.calls.index("free set1") < nvml.calls.index("shutdown")
    assert nvml.calls.index("free set2") < nvml.calls.index("shutdown")
    waits = [call for call in nvml.calls if call.startswith("wait")]
    assert gpu.xid_events(0, 8) == [] and [c for c in nvml.calls if c.startswith("wait")] == waits  # released


def test_a_take_hung_in_one_gpus_event_set_holds_back_no_other_gpus_take(nvml: HealthNvml) -> None:
    gpu = backend(nvml)
    assert gpu.xid_events(0, 8) == [] and gpu.xid_events(1, 8) == []  # both sets made
    nvml.hung_sets["set1"] = threading.Event()  # GPU 0's wait hangs in the driver...
    nvml.happen("handle1", 0x8, 79)  # ...while GPU 1 has an XID 79 queued
    hung = threading.Thread(target=gpu.xid_events, args=(0, 8), daemon=True)
    hung.start()
    wait_until(lambda: nvml.calls.count("wait set1") == 2, what="GPU 0's take in its wait")
    taken: list[list[XidEvent]] = []
    other = threading.Thread(target=lambda: taken.append(gpu.xid_events(1, 8)), daemon=True)
    other.start()
    # Before, one lock held every GPU's takes: GPU 1's waited for GPU 0's hung call.
    other.join(timeout=10)
    in_time = list(taken)  # while GPU 0's call still hangs
    nvml.hung_sets["set1"].set()
    hung.join(timeout=10)
    assert in_time == [[XidEvent(1, "GPU-h200-handle1", 79)]]
    gpu.release()  # after the take in progress: the sets are freed before shutdown
    assert nvml.calls.index("free set1") < nvml.calls.index("shutdown")


def test_a_lost_gpus_event_set_fails_alone_and_a_failed_registration_frees_its_set(nvml: HealthNvml) -> None:
    gpu = backend(nvml)
    for index in (0, 1):
        gpu.xid_events(index, 8)  # both sets made
    nvml.lost_sets.add("set2")  # GPU 1 fell off the bus
    nvml.happen("handle0", 0x8, 31)
    with pytest.raises(GpuError) as lost:
        gpu.xid_events(1, 8)
    assert lost.value.code is ErrorCode.GPU_IS_LOST
    assert gpu.xid_events(0, 8) == [XidEvent(0, "GPU-h200", 31)]
    # A registration that fails (UNKNOWN: "event set is in undefined state and should be freed").
    nvml.failing_registration.add("handle2")
    with pytest.raises(GpuError):
        gpu.xid_events(2, 8)
    assert nvml.calls[-1] == "free set3" and "set3" not in nvml.registered
    nvml.failing_registration.clear()
    assert gpu.xid_events(2, 8) == [] and nvml.registered["set4"] == ["handle2"]  # made anew at the next take


def test_a_gpu_without_xid_events_gets_no_set_and_is_said_once(
    nvml: HealthNvml, caplog: pytest.LogCaptureFixture
) -> None:
    nvml.without_xid_events.add("handle1")
    gpu = backend(nvml)
    with caplog.at_level(logging.INFO):
        assert gpu.xid_events(1, 8) == [] and gpu.xid_events(1, 8) == []
    assert nvml.event_sets == 0
    assert len([r for r in caplog.records if "does not report XID events" in r.message]) == 1
