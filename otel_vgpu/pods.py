"""The pod directory: pod UID to name and namespace."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class PodMeta:
    namespace: str
    name: str


class PodDirectory(Protocol):
    def lookup(self, pod_uid: str) -> PodMeta | None:
        """The pod's name, or None when it is not known (yet)."""
        ...


class StaticDirectory:
    """A fixed directory (the simulated node's)."""

    def __init__(self, pods: Mapping[str, PodMeta]) -> None:
        self._pods = dict(pods)

    def lookup(self, pod_uid: str) -> PodMeta | None:
        return self._pods.get(pod_uid)


class UnresolvedDirectory:
    """Resolves nothing: pods keep their UID in `pod` and an empty `namespace`."""

    def lookup(self, pod_uid: str) -> PodMeta | None:
        return None
