"""A sampler of a simulated node, wired as the agent wires one on a node: processes attributed
through the node's /proc, pods named by its directory, shares from its allocation."""

from __future__ import annotations

from typing import Any

from otel_vgpu.allocation.ratio import RatioSource
from otel_vgpu.collect.sampler import Sampler
from otel_vgpu.pods.attribution import Attributor, ProcReader
from otel_vgpu.sim.node import SimulatedNode


def sim_sampler(node: SimulatedNode, ratio: RatioSource, **extra: Any) -> Sampler:
    """A sampler of `node` under `ratio`; `extra`: Sampler's other keywords (health, clock, reader...)."""
    return Sampler(
        node,
        attributor=Attributor(ProcReader(node.proc_root)),
        directory=node.directory(),
        allocation=node,
        ratio=ratio,
        **extra,
    )
