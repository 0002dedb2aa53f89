"""sim/processes.py `Workload.at`: the processes it makes are the scenario's at each time, and
what it keeps of them to make them once stays bounded."""

from __future__ import annotations

import pytest

from otel_vgpu.sim.processes import Workload
from otel_vgpu.sim.scenario_file import parse_scenario

pytestmark = pytest.mark.unit

WAVING = (
    "gpus: [{memory: 80GiB}]\npods:\n  - name: a\n    processes:\n"
    "      - {gpu: 0, memory: {mean: 5GiB, amplitude: 2GiB, period_s: 7}, sm: 0.4}\n"
    "      - {gpu: 0, memory: 3GiB, sm: 0.2}\n"
)


def test_a_process_whose_memory_waves_is_made_anew_and_what_is_kept_stays_bounded() -> None:
    scenario = parse_scenario(WAVING, "s.yaml")
    workload = Workload()
    seen = set()
    for k in range(2000):
        waving, steady = workload.at(scenario, k * 0.013)
        assert waving.memory == int(scenario.pods[0].processes[0].memory.at(k * 0.013))
        assert steady.memory == 3 * 1024**3
        seen.add(id(steady))
        assert len(workload._made) <= 4 * 2 + 64 + 1
    # The steady process is the same one while it holds, made again only after a clearing.
    assert len(seen) < 100
    # Another scenario, even at the same times, gets processes of its own.
    other = parse_scenario(WAVING.replace("3GiB", "4GiB"), "s.yaml")
    assert workload.at(other, 0.0)[1].memory == 4 * 1024**3
