"""The NVML backend, against a double of nvidia-ml-py's module.

No GPU is available to the tests, so the module's functions are replaced;
the error classes are nvidia-ml-py's own, raised the way NVML raises them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any, ClassVar

import pynvml
import pytest

from otel_vgpu.gpu.backend import (
    ENGINES,
    NVML_RETURN_VALUES,
    AccountingRecord,
    ErrorCode,
    GpuError,
    GpuProcess,
    ProcessUse,
    UtilizationSample,
)
from otel_vgpu.gpu.nvml import SAMPLING_TYPES, NvmlBackend, NvmlUnavailable
from otel_vgpu.gpu.nvml_session import Scope

pytestmark = pytest.mark.unit


class FakeNvml:
    NVMLError = pynvml.NVMLError

    def __init__(self) -> None:
        self.fail: dict[str, int] = {}
        self.compute: list[Any] = [
            SimpleNamespace(pid=10, usedGpuMemory=1000),
            SimpleNamespace(pid=11, usedGpuMemory=None),
        ]
        self.graphics: list[Any] = [
            SimpleNamespace(pid=10, usedGpuMemory=1000),
            SimpleNamespace(pid=12, usedGpuMemory=5),
        ]
        self.mps: list[Any] = []
        self.samples: list[Any] = [SimpleNamespace(pid=10, timeStamp=123, smUtil=42, memUtil=17, encUtil=0, decUtil=3)]
        self.gpu_samples: list[tuple[int, int]] = [(100, 30), (300, 90), (500, 120)]
        self.energy_mj = 123_456
        self.since: list[int] = []
        self.sampling_types: list[int] = []
        self.shutdown = False
        self.calls: list[str] = []
        self.fail_times: dict[str, tuple[int, int]] = {}  # call -> (code, how many more times)
        self.handles_asked = 0

    def _check(self, name: str) -> None:
        self.calls.append(name)
        if name in self.fail:
            raise pynvml.NVMLError(self.fail[name])
        if name in self.fail_times and self.fail_times[name][1] > 0:
            code, left = self.fail_times[name]
            self.fail_times[name] = (code, left - 1)
            raise pynvml.NVMLError(code)

    # Accounting (nvml.h): its mode, its circular buffer's PIDs, and each one's lifetime stats.
    accounting_mode: int = pynvml.NVML_FEATURE_DISABLED
    accounting: ClassVar[dict[int, Any]] = {
        7: SimpleNamespace(gpuUtilization=63, memoryUtilization=0xFFFFFFFF, time=1500, startTime=9_000, isRunning=0),
    }

    def nvmlDeviceGetAccountingMode(self, handle: str) -> int:
        self._check("accounting_mode")
        return self.accounting_mode

    def nvmlDeviceGetAccountingPids(self, handle: str) -> list[int]:
        self._check("accounting_pids")
        return list(self.accounting)

    def nvmlDeviceGetAccountingStats(self, handle: str, pid: int) -> Any:
        self._check("accounting_stats")
        if pid not in self.accounting:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return self.accounting[pid]

    def nvmlInit(self) -> None:
        self._check("init")

    def nvmlShutdown(self) -> None:
        self.shutdown = True

    def nvmlDeviceGetCount(self) -> int:
        self._check("count")
        return 2

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
        self.handles_asked += 1
        return f"handle{index}"

    nvmlMemory_v2 = pynvml.nvmlMemory_v2

    def nvmlDeviceGetMemoryInfo(self, handle: str, version: int | None = None) -> Any:
        # As nvidia-ml-py's: with a version, nvmlDeviceGetMemoryInfo_v2 (nvmlMemory_v2_t), whose
        # `used` is v1's less the reserved, as an H200 with driver 580 answers.
        if version is not None:
            self._check("memory_v2")
            assert version == pynvml.nvmlMemory_v2
            return SimpleNamespace(version=version, total=80, reserved=6, used=24, free=50)
        self._check("memory")
        if handle.startswith("mig"):
            return SimpleNamespace(total=18, used=2, free=16)
        return SimpleNamespace(total=80, used=30, free=50)

    def nvmlDeviceGetMinorNumber(self, handle: str) -> int:
        return int(handle.removeprefix("handle")) + 5

    def nvmlDeviceGetGpuInstanceId(self, mig: str) -> int:
        return int(mig.removeprefix("mig")) + 7

    def nvmlDeviceGetGpuInstanceById(self, parent: str, gpu_instance: int) -> str:
        if gpu_instance != 7:  # NVML refuses an unprivileged caller some instances
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NO_PERMISSION)
        return f"gi{gpu_instance}"

    def nvmlGpuInstanceGetInfo(self, instance: str) -> Any:
        return SimpleNamespace(profileId=19, placement=SimpleNamespace(start=4, size=1))

    def nvmlDeviceGetUtilizationRates(self, handle: str) -> Any:
        return SimpleNamespace(gpu=55, memory=10)

    def nvmlDeviceGetUUID(self, handle: str) -> str:
        self._check("uuid")
        return f"GPU-{handle}"

    def nvmlSystemGetDriverVersion(self) -> str:
        self._check("driver_version")
        return "580.159.04"

    def nvmlDeviceGetPciInfo(self, handle: str) -> Any:
        self._check("pci_info")
        # nvidia-ml-py gives busId as bytes (c_char array); busIdLegacy has a 4-digit domain.
        return SimpleNamespace(busId=f"00000000:{3 + int(handle[-1]):02X}:00.0".encode(), busIdLegacy=b"0000:03:00.0")

    def nvmlDeviceGetName(self, handle: str) -> bytes:
        self._check("name")
        return b"NVIDIA H200 MIG 1g.18gb" if handle.startswith("mig") else b"NVIDIA H200"

    NVML_DEVICE_MIG_ENABLE = pynvml.NVML_DEVICE_MIG_ENABLE

    def nvmlDeviceGetMigMode(self, handle: str) -> tuple[int, int]:
        self.calls.append("mig_mode")
        if handle != "handle1":
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return (pynvml.NVML_DEVICE_MIG_ENABLE, pynvml.NVML_DEVICE_MIG_ENABLE)

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: str) -> int:
        return 3

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: str, index: int) -> str:
        if index == 1:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return f"mig{index}"

    def nvmlDeviceGetComputeRunningProcesses(self, handle: str) -> list[Any]:
        self._check("processes")
        if handle.startswith("mig"):
            return [SimpleNamespace(pid=100 + int(handle.removeprefix("mig")), usedGpuMemory=7)]
        if handle == "handle1":  # MIG mode: the parent lists only to a privileged caller
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NO_PERMISSION)
        return self.compute

    def nvmlDeviceGetMPSComputeRunningProcesses(self, handle: str) -> list[Any]:
        self._check("mps")
        return self.mps if handle == "handle0" else []

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: str) -> list[Any]:
        return [] if handle.startswith("mig") else self.graphics

    def nvmlDeviceGetProcessUtilization(self, handle: str, since: int) -> list[Any]:
        self.since.append(since)
        self._check("utilization")
        return self.samples

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: str) -> int:
        self._check("energy")
        return self.energy_mj

    def nvmlDeviceGetSamples(self, handle: str, sampling_type: int, since: int) -> tuple[int, list[Any]]:
        self._check("gpu_samples")
        self.sampling_types.append(sampling_type)
        samples = [SimpleNamespace(timeStamp=t, sampleValue=SimpleNamespace(uiVal=v)) for t, v in self.gpu_samples]
        return pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, [s for s in samples if s.timeStamp > since]


def test_device_fields_and_units() -> None:
    backend = NvmlBackend(FakeNvml())
    device = backend.device(0)
    assert (device.index, device.uuid, device.model, device.minor_number) == (0, "GPU-handle0", "NVIDIA H200", 5)
    assert (device.memory_total, device.memory_used, device.utilization) == (80, 30, 0.55)
    assert device.migs == ()


def test_the_reserved_memory_is_v2s_and_used_stays_v1s_which_holds_it() -> None:
    nvml = FakeNvml()
    backend = NvmlBackend(nvml)
    device = backend.device(0)
    assert (device.memory_used, device.memory_reserved) == (30, 6)
    assert nvml.calls.count("memory") == nvml.calls.count("memory_v2") == 1
    # The reservation is the driver's, read once a session: later sweeps read v1 alone.
    assert [backend.device(0).memory_reserved for _ in range(2)] == [6, 6]
    assert (nvml.calls.count("memory"), nvml.calls.count("memory_v2")) == (3, 1)


@pytest.mark.parametrize(
    "code",
    [
        pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
        pynvml.NVML_ERROR_NOT_SUPPORTED,
        pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
    ],
)
def test_a_driver_without_v2_has_no_reserved_figure_and_is_not_asked_again(code: int) -> None:
    nvml, clock = FakeNvml(), Clock()
    backend = NvmlBackend(nvml, clock=clock)
    nvml.fail["memory_v2"] = code
    assert [backend.device(0).memory_reserved for _ in range(3)] == [None] * 3
    assert backend.device(0).memory_used == 30, "v1's figure as ever"
    assert nvml.calls.count("memory_v2") == 1, "once per session"
    # A new session (a driver upgrade may bring it) asks again.
    del nvml.fail["memory_v2"]
    backend.release()
    backend.resume()
    backend.device_count()
    assert backend.device(0).memory_reserved == 6


class OlderNvml(FakeNvml):
    """An nvidia-ml-py from before the names in `missing`."""

    missing: ClassVar[frozenset[str]] = frozenset()

    def __getattribute__(self, name: str) -> Any:
        if name in type(self).missing:
            raise AttributeError(name)
        return super().__getattribute__(name)


class NoV2Nvml(OlderNvml):
    """An nvidia-ml-py from before nvmlMemory_v2_t."""

    missing = frozenset({"nvmlMemory_v2"})


def test_a_library_without_the_v2_structure_has_no_reserved_figure() -> None:
    nvml = NoV2Nvml()
    assert NvmlBackend(nvml).device(0).memory_reserved is None
    assert "memory_v2" not in nvml.calls


def test_the_watchs_probe_is_the_memory_in_use_of_the_device_call() -> None:
    backend = NvmlBackend(FakeNvml())
    assert backend.memory_used(0) == backend.device(0).memory_used == 30


def test_a_gpu_in_mig_mode_has_its_mig_devices_and_no_utilization() -> None:
    backend = NvmlBackend(FakeNvml())
    device = backend.device(1)
    assert device.utilization is None  # NVML has none for a GPU in MIG mode
    assert [(m.uuid, m.profile, m.memory_total, m.memory_used) for m in device.migs] == [
        ("GPU-mig0", "1g.18gb", 18, 2),
        ("GPU-mig2", "1g.18gb", 18, 2),
    ]
    # Profile ID and placement where NVML gives the GPU instance; unknown where it refuses.
    assert [(m.gpu_instance_id, m.profile_id, m.placement_start) for m in device.migs] == [
        (7, 19, 4),
        (9, None, None),
    ]
    # Listed per MIG device: the parent's handle would need privileges.
    assert backend.processes(1) == [
        GpuProcess(100, 7, mig_uuid="GPU-mig0"),
        GpuProcess(102, 7, mig_uuid="GPU-mig2"),
    ]


def test_mps_clients_are_listed_once_and_an_old_driver_without_the_list_is_no_error() -> None:
    nvml = FakeNvml()
    nvml.mps = [SimpleNamespace(pid=10, usedGpuMemory=1000), SimpleNamespace(pid=13, usedGpuMemory=64)]
    backend = NvmlBackend(nvml)
    backend.device(0)
    assert sorted(p.pid for p in backend.processes(0)) == [10, 11, 12, 13]
    nvml.fail["mps"] = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
    assert sorted(p.pid for p in backend.processes(0)) == [10, 11, 12]
    del nvml.fail["mps"]
    nvml.calls.clear()
    backend.processes(0)
    assert "mps" not in nvml.calls  # asked once, then left alone


def test_error_codes_are_nvmls_own_numbers() -> None:
    # The table in gpu.py against nvidia-ml-py's constants, name by name.
    constants = {
        value: name.removeprefix("NVML_ERROR_")
        for name, value in vars(pynvml).items()
        if name.startswith("NVML_ERROR_") and isinstance(value, int)
    }
    assert {number: code.name for number, code in NVML_RETURN_VALUES.items()} == constants


def test_a_number_the_table_does_not_know_is_unknown_not_a_crash() -> None:
    nvml = FakeNvml()
    backend = NvmlBackend(nvml)
    nvml.fail["processes"] = 4242  # a newer driver's code
    with pytest.raises(GpuError) as caught:
        backend.processes(0)
    assert caught.value.code is ErrorCode.UNKNOWN


def test_a_gpu_lost_while_asking_about_mig_fails_its_device_call() -> None:
    # Not "no MIG": the device is gone, and the sampler must hear it.
    nvml = FakeNvml()

    def lost(handle: str) -> tuple[int, int]:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)

    nvml.nvmlDeviceGetMigMode = lost  # type: ignore[method-assign]
    with pytest.raises(GpuError) as caught:
        NvmlBackend(nvml).device(0)
    assert caught.value.code is ErrorCode.GPU_IS_LOST


def test_compute_and_graphics_merge_and_unknown_memory_is_none() -> None:
    backend = NvmlBackend(FakeNvml())
    assert sorted(backend.processes(0), key=lambda p: p.pid) == [
        GpuProcess(10, 1000),
        GpuProcess(11, None),
        GpuProcess(12, 5),
    ]


def test_samples_are_converted_and_not_found_means_idle() -> None:
    nvml = FakeNvml()
    backend = NvmlBackend(nvml)
    assert backend.utilization_samples(0, 99) == [
        UtilizationSample(10, 123, ProcessUse(0.42, memory_copy=0.17, decoder=0.03))
    ]
    assert nvml.since == [99]
    nvml.fail["utilization"] = pynvml.NVML_ERROR_NOT_FOUND
    assert backend.utilization_samples(0, 100) == []


class NvmlR550(FakeNvml):
    """A driver with the newer per-process call (JPEG and optical flow) and GPU-instance
    profiles that hold the H200's engines as its NVML listed them: no encoder
    (bench/results/h200-engine-figures.md)."""

    NVML_GPU_INSTANCE_PROFILE_COUNT = pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT
    # (decoders, encoders, JPEG, optical flow) of the profiles NVML answered on the H200.
    PROFILES: ClassVar = {0: (1, 0, 1, 0), 4: (7, 0, 7, 1), 7: (1, 0, 1, 1)}

    def __init__(self) -> None:
        super().__init__()
        self.v2: list[Any] = [
            SimpleNamespace(pid=10, timeStamp=123, smUtil=42, memUtil=17, encUtil=0, decUtil=3, jpgUtil=25, ofaUtil=50)
        ]

    def nvmlDeviceGetProcessesUtilizationInfo(self, handle: str, since: int) -> list[Any]:
        self._check("utilization_v2")
        return self.v2

    def nvmlDeviceGetGpuInstanceProfileInfo(self, handle: str, profile: int) -> Any:
        self._check("profile")
        if profile not in self.PROFILES:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        dec, enc, jpg, ofa = self.PROFILES[profile]
        return SimpleNamespace(decoderCount=dec, encoderCount=enc, jpegCount=jpg, ofaCount=ofa)


def test_the_newer_per_process_call_gives_jpeg_and_optical_flow_and_the_older_serves_where_it_is_missing() -> None:
    nvml = NvmlR550()
    backend = NvmlBackend(nvml)
    use = ProcessUse(0.42, memory_copy=0.17, decoder=0.03, jpeg=0.25, optical_flow=0.5)
    assert backend.utilization_samples(0, 99) == [UtilizationSample(10, 123, use)]
    assert "utilization" not in nvml.calls
    assert backend.device(0).engines == {"memory_copy", "decoder", "jpeg", "optical_flow"}
    # A driver before R550: the older call, asked alone from then on, and no JPEG or optical flow.
    nvml.fail["utilization_v2"] = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
    assert backend.utilization_samples(0, 99) == [UtilizationSample(10, 123, ProcessUse(0.42, 0.17, decoder=0.03))]
    backend.utilization_samples(0, 99)
    assert nvml.calls.count("utilization_v2") == 2 and nvml.calls.count("utilization") == 2
    assert backend.device(0).engines == {"memory_copy", "decoder"}
    # Idle under the newer call too.
    nvml.fail = {"utilization": pynvml.NVML_ERROR_NOT_FOUND}
    assert backend.utilization_samples(0, 99) == []


def test_engines_come_from_the_gpu_instance_profiles_asked_once_per_session() -> None:
    nvml = NvmlR550()
    backend = NvmlBackend(nvml)
    # The H200's profiles hold no encoder: NVML's encoder calls answer alike on it, the profiles do not.
    assert backend.device(0).engines == {"memory_copy", "decoder", "jpeg", "optical_flow"}
    asked = nvml.calls.count("profile")
    assert asked == pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT
    backend.device(0)
    assert nvml.calls.count("profile") == asked
    # In MIG mode no engine figure is read per process at all.
    assert backend.device(1).engines == frozenset()


def test_a_gpu_without_profiles_has_the_engines_whose_calls_nvml_answers() -> None:
    class NoMig(FakeNvml):
        def nvmlDeviceGetEncoderUtilization(self, handle: str) -> list[int]:
            return [0, 100_000]

        def nvmlDeviceGetDecoderUtilization(self, handle: str) -> list[int]:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    assert NvmlBackend(NoMig()).device(0).engines == {"memory_copy", "encoder"}


def test_each_figure_is_read_from_its_own_buffer() -> None:
    assert SAMPLING_TYPES == {
        "sm": pynvml.NVML_GPU_UTILIZATION_SAMPLES,
        "memory_copy": pynvml.NVML_MEMORY_UTILIZATION_SAMPLES,
        "encoder": pynvml.NVML_ENC_UTILIZATION_SAMPLES,
        "decoder": pynvml.NVML_DEC_UTILIZATION_SAMPLES,
        "jpeg": pynvml.NVML_JPG_UTILIZATION_SAMPLES,
        "optical_flow": pynvml.NVML_OFA_UTILIZATION_SAMPLES,
    }
    assert set(SAMPLING_TYPES) == {"sm", *ENGINES}
    nvml = FakeNvml()
    backend = NvmlBackend(nvml)
    for figure in SAMPLING_TYPES:
        backend.gpu_utilization_samples(0, 0, figure)
    assert nvml.sampling_types == list(SAMPLING_TYPES.values())


@pytest.mark.parametrize(
    ("call", "code", "name"),
    [
        ("memory", pynvml.NVML_ERROR_GPU_IS_LOST, "GPU_IS_LOST"),
        ("processes", pynvml.NVML_ERROR_UNKNOWN, "UNKNOWN"),
        ("utilization", pynvml.NVML_ERROR_NOT_SUPPORTED, "NOT_SUPPORTED"),
        ("count", pynvml.NVML_ERROR_UNINITIALIZED, "UNINITIALIZED"),
        ("processes", pynvml.NVML_ERROR_TIMEOUT, "TIMEOUT"),
    ],
)
def test_errors_become_gpu_errors_with_stable_codes(call: str, code: int, name: str) -> None:
    nvml = FakeNvml()
    backend = NvmlBackend(nvml)
    nvml.fail[call] = code
    with pytest.raises(GpuError) as caught:
        {
            "memory": lambda: backend.device(0),
            "processes": lambda: backend.processes(0),
            "utilization": lambda: backend.utilization_samples(0, 0),
            "count": backend.device_count,
        }[call]()
    assert caught.value.code == name


def test_init_failure_is_one_line_naming_the_library_and_simulate() -> None:
    nvml = FakeNvml()
    nvml.fail["init"] = pynvml.NVML_ERROR_LIBRARY_NOT_FOUND
    with pytest.raises(NvmlUnavailable) as caught:
        NvmlBackend(nvml)
    message = str(caught.value)
    assert "libnvidia-ml.so.1" in message and "--simulate" in message and "\n" not in message


def test_real_module_without_driver_is_unavailable() -> None:
    # This machine has no NVIDIA driver: the real nvidia-ml-py must fail to
    # load NVML, and the backend must say so instead of pretending.
    with pytest.raises(NvmlUnavailable, match="could not be initialised"):
        NvmlBackend()


def test_close_shuts_nvml_down() -> None:
    nvml = FakeNvml()
    NvmlBackend(nvml).close()
    assert nvml.shutdown


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_driver_not_loaded_at_start_is_retried_with_backoff() -> None:
    nvml, clock = FakeNvml(), Clock()
    nvml.fail["init"] = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    backend = NvmlBackend(nvml, clock=clock)  # starts anyway: the driver may still be loading
    assert not backend.ready
    with pytest.raises(GpuError) as caught:
        backend.device_count()
    assert caught.value.code == "UNINITIALIZED" and nvml.calls.count("init") == 1  # waits for its backoff
    clock.now += 1.1
    with pytest.raises(GpuError) as caught:
        backend.device_count()
    assert caught.value.code == "DRIVER_NOT_LOADED" and nvml.calls.count("init") == 2
    clock.now += 1.5  # the backoff doubled to 2 s
    with pytest.raises(GpuError):
        backend.device_count()
    assert nvml.calls.count("init") == 2
    del nvml.fail["init"]
    clock.now += 1.0
    assert backend.device_count() == 2 and backend.ready


def test_driver_going_away_mid_run_is_recovered_without_restart() -> None:
    nvml, clock = FakeNvml(), Clock()
    backend = NvmlBackend(nvml, clock=clock)
    assert backend.device(0).uuid == "GPU-handle0"
    asked = nvml.handles_asked
    nvml.fail["count"] = pynvml.NVML_ERROR_UNINITIALIZED
    with pytest.raises(GpuError) as caught:
        backend.device_count()
    assert caught.value.code == "UNINITIALIZED" and nvml.shutdown and not backend.ready
    del nvml.fail["count"]
    with pytest.raises(GpuError):  # within the backoff NVML is left alone
        backend.device_count()
    clock.now += 1.1
    assert backend.device_count() == 2
    backend.device(0)
    assert nvml.handles_asked == asked + 1, "handles of the old session are not reused"


def test_a_call_that_fails_after_the_session_it_began_in_tears_down_no_newer_one() -> None:
    # A health read that hung across a driver pause and resume returns UNINITIALIZED from the old
    # session: the new one stays up.
    nvml = FakeNvml()
    backend = NvmlBackend(nvml)
    backend.device(0)
    calls_before = nvml.calls.count("count")

    def stale(handle: str, version: int | None = None) -> Any:
        backend.release()  # meanwhile: the pause ...
        backend.resume()
        backend.device_count()  # ... and the next sweep's new session
        raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)

    nvml.nvmlDeviceGetMemoryInfo = stale  # type: ignore[method-assign]
    with pytest.raises(GpuError):
        backend.memory_used(0)
    del nvml.nvmlDeviceGetMemoryInfo
    assert backend.ready and nvml.calls.count("count") == calls_before + 1
    assert backend.device(0).uuid == "GPU-handle0"


def test_backoff_is_capped() -> None:
    nvml, clock = FakeNvml(), Clock()
    nvml.fail["init"] = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    backend = NvmlBackend(nvml, clock=clock)
    waits = []
    for _ in range(10):
        before = nvml.calls.count("init")
        start = clock.now
        while nvml.calls.count("init") == before:
            clock.now += 0.5
            with pytest.raises(GpuError):
                backend.device_count()
        waits.append(clock.now - start)
    assert waits[0] <= 1.0 and waits[-1] <= 60.5 and max(waits) >= 59.5


def test_listing_that_grew_between_sizing_and_reading_is_asked_again() -> None:
    nvml = FakeNvml()
    backend = NvmlBackend(nvml)
    nvml.fail_times["processes"] = (pynvml.NVML_ERROR_INSUFFICIENT_SIZE, 2)
    assert {p.pid for p in backend.processes(0)} == {10, 11, 12}
    nvml.fail_times["processes"] = (pynvml.NVML_ERROR_INSUFFICIENT_SIZE, 5)
    with pytest.raises(GpuError) as caught:
        backend.processes(0)
    assert caught.value.code == "INSUFFICIENT_SIZE"


def test_release_shuts_nvml_down_until_resumed_then_initialises_at_once() -> None:
    nvml, clock = FakeNvml(), Clock()
    backend = NvmlBackend(nvml, clock=clock)
    backend.device(0)
    backend.release()
    assert nvml.shutdown and not backend.ready
    inits = nvml.calls.count("init")
    with pytest.raises(GpuError) as caught:
        backend.device_count()
    assert "released" in str(caught.value) and nvml.calls.count("init") == inits, "NVML is not touched while released"
    backend.resume()
    assert backend.device_count() == 2 and nvml.calls.count("init") == inits + 1, "no backoff to sit out"
    asked = nvml.handles_asked
    backend.device(0)
    assert nvml.handles_asked == asked + 1, "handles of the old session are not reused"


def test_the_gpus_own_samples_are_read_as_fractions_and_none_is_no_sample() -> None:
    nvml = FakeNvml()
    backend = NvmlBackend(nvml)
    # percent as NVML gives it, clamped (drivers have reported over 100)
    assert backend.gpu_utilization_samples(0, 200) == [(300, 0.9), (500, 1.0)]
    nvml.fail["gpu_samples"] = pynvml.NVML_ERROR_NOT_FOUND
    assert backend.gpu_utilization_samples(0, 600) == []
    nvml.fail["gpu_samples"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    with pytest.raises(GpuError) as caught:
        backend.gpu_utilization_samples(0, 600)
    assert caught.value.code == "NOT_SUPPORTED"


def test_a_gpu_without_an_energy_counter_is_asked_once_per_session() -> None:
    nvml = FakeNvml()
    backend = NvmlBackend(nvml)
    assert backend.energy(0) == 123_456
    assert backend.device(0).energy_mj is None, "read on its own cadence, not with the device"
    nvml.fail["energy"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    assert backend.energy(1) is None
    asked = nvml.calls.count("energy")
    assert backend.energy(1) is None and nvml.calls.count("energy") == asked, "not asked again"


def test_a_gpus_uuid_and_name_are_asked_once_per_session() -> None:
    nvml = FakeNvml()
    backend = NvmlBackend(nvml)
    first = backend.device(0)
    assert (first.uuid, first.model) == ("GPU-handle0", "NVIDIA H200")
    asked = nvml.calls.count("uuid"), nvml.calls.count("name")
    assert backend.device(0) == first
    assert (nvml.calls.count("uuid"), nvml.calls.count("name")) == asked, "not asked again"
    # a new session (the driver released and back) may number the GPUs anew: asked again
    backend.release()
    backend.resume()
    backend.device_count()
    backend.device(0)
    assert nvml.calls.count("uuid") == asked[0] + 1


def test_a_gpus_bus_id_and_the_driver_version_are_asked_once_per_session() -> None:
    nvml = FakeNvml()
    backend = NvmlBackend(nvml)
    for _ in range(3):
        zero, one = backend.device(0), backend.device(1)
    assert (zero.pci_bus_id, one.pci_bus_id) == ("00000000:03:00.0", "00000000:04:00.0")
    assert zero.driver_version == one.driver_version == "580.159.04"
    assert nvml.calls.count("pci_info") == 2 and nvml.calls.count("driver_version") == 1
    backend.release()
    backend.resume()
    backend.device_count()
    backend.device(0)
    assert nvml.calls.count("driver_version") == 2, "a new session may have a new driver"


def test_a_driver_that_gives_no_bus_id_or_version_leaves_them_none_and_is_not_asked_again() -> None:
    nvml = FakeNvml()
    nvml.fail["pci_info"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    nvml.fail["driver_version"] = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
    backend = NvmlBackend(nvml)
    device = backend.device(0)
    assert (device.pci_bus_id, device.driver_version) == (None, None)
    backend.device(0)
    assert nvml.calls.count("driver_version") == 1


def test_what_a_gpu_lacks_is_asked_once_per_session_and_again_after_a_new_one() -> None:
    # GPU 0 has no MIG (NOT_SUPPORTED): asked once, not every sweep, until NVML is
    # initialised anew (a driver upgrade may bring what it lacked).
    nvml, clock = FakeNvml(), Clock()
    backend = NvmlBackend(nvml, clock=clock)
    for _ in range(3):
        assert backend.device(0).migs == ()
        assert backend.device(1).migs != ()
    assert nvml.calls.count("mig_mode") == 1 + 3, "GPU 0 once, GPU 1 (in MIG mode) each time"
    nvml.fail["count"] = pynvml.NVML_ERROR_UNINITIALIZED
    with pytest.raises(GpuError):
        backend.device_count()
    del nvml.fail["count"]
    clock.now += 1.1
    backend.device_count()
    nvml.calls.clear()
    backend.device(0)
    assert nvml.calls.count("mig_mode") == 1


class NoMpsNvml(OlderNvml):
    """An nvidia-ml-py from before nvmlDeviceGetMPSComputeRunningProcesses."""

    missing = frozenset({"nvmlDeviceGetMPSComputeRunningProcesses"})


def test_a_library_without_the_mps_listing_lists_the_others_and_says_so_once_by_its_name(
    caplog: pytest.LogCaptureFixture,
) -> None:
    nvml = NoMpsNvml()
    backend = NvmlBackend(nvml)
    backend.device(0)
    with caplog.at_level(logging.INFO):
        assert sorted(p.pid for p in backend.processes(0)) == [10, 11, 12]
        assert sorted(p.pid for p in backend.processes(0)) == [10, 11, 12]
    assert [r.message for r in caplog.records if "lacks" in r.message] == [
        "NVML lacks nvmlDeviceGetMPSComputeRunningProcesses here (FUNCTION_NOT_FOUND); what it gives is left out"
    ]


class NoPciNoDriverVersionNvml(OlderNvml):
    """An nvidia-ml-py without two calls whose absences are kept for the whole driver and for a GPU."""

    missing = frozenset({"nvmlDeviceGetPciInfo", "nvmlSystemGetDriverVersion"})


def test_each_call_a_library_lacks_is_its_own_absence() -> None:
    # Each is kept by its own name: the driver version's absence is not the bus ID's, nor the MPS listing's.
    nvml = NoPciNoDriverVersionNvml()
    backend = NvmlBackend(nvml)
    device = backend.device(0)
    assert (device.pci_bus_id, device.driver_version) == (None, None)
    assert sorted(p.pid for p in backend.processes(0)) == [10, 11, 12]
    assert "mps" in nvml.calls


def test_a_lost_session_raises_even_out_of_a_call_that_takes_any_error() -> None:
    # The GPU-instance profiles are asked taking any refusal as "no profile"; a lost session is
    # none: it raises at once, not after every profile's call has torn the session down anew.
    nvml = NvmlR550()
    backend = NvmlBackend(nvml)
    nvml.fail["profile"] = pynvml.NVML_ERROR_UNINITIALIZED
    with pytest.raises(GpuError) as caught:
        backend.device(0)
    assert caught.value.code is ErrorCode.UNINITIALIZED and not backend.ready
    assert nvml.calls.count("profile") == 1


def test_a_scope_below_the_driver_is_of_a_gpu() -> None:
    assert Scope(gpu=0, figure="sm.clock") != Scope(gpu=0, figure="memory.clock") != Scope(gpu=0)
    with pytest.raises(ValueError, match="of a GPU"):
        Scope(figure="sm.clock")
    with pytest.raises(ValueError, match="of a GPU"):
        Scope(instance=1)


@pytest.mark.parametrize(
    ("call", "ask", "answer"),
    [
        ("energy", lambda backend: backend.energy(0), 123_456),  # not taken for a GPU without a counter
        ("memory_v2", lambda backend: backend.device(0).memory_reserved, 6),  # nor for a driver without v2
    ],
)
def test_a_failure_that_is_no_absence_still_fails_the_call(
    call: str, ask: Callable[[NvmlBackend], Any], answer: int
) -> None:
    nvml = FakeNvml()
    backend = NvmlBackend(nvml)
    nvml.fail[call] = pynvml.NVML_ERROR_GPU_IS_LOST
    with pytest.raises(GpuError) as caught:
        ask(backend)
    assert caught.value.code is ErrorCode.GPU_IS_LOST
    del nvml.fail[call]
    assert ask(backend) == answer, "a lost GPU is not taken for one that lacks the call"


def test_accounting_is_read_only_where_its_mode_is_on_and_in_its_units() -> None:
    nvml = FakeNvml()
    backend = NvmlBackend(nvml)
    assert backend.accounting_pids(0) is None and "accounting_pids" not in nvml.calls
    nvml.accounting_mode = pynvml.NVML_FEATURE_ENABLED
    assert backend.accounting_pids(0) == [7]
    # Percent to 0-1, milliseconds to seconds, NVML_VALUE_NOT_AVAILABLE to 0; a PID the
    # buffer lacks is none.
    assert backend.accounting_stats(0, 7) == AccountingRecord(7, 9_000, 1.5, False, 0.63, 0.0)
    assert backend.accounting_stats(0, 8) is None
    nvml.fail["accounting_mode"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    assert backend.accounting_pids(1) is None
    asked = nvml.calls.count("accounting_mode")
    assert backend.accounting_pids(1) is None and nvml.calls.count("accounting_mode") == asked, "not asked again"
