"""The node's virtualization ratio, from `gpu_allocation.txt`.

The format is the original exporter's: one positive number, the count of
vGPUs each physical GPU is presented as (`2` = two vGPUs per GPU). Comments
(`#` to the end of the line) and blank lines are allowed. The file may
instead hold `auto`: then each GPU's ratio is the number of replicas the
kubelet's device plugins advertise for it (GetAllocatableResources). The
file is reread when it changes, so a ConfigMap update takes effect without
a restart; a bad change keeps the last good ratio.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from otel_vgpu.files import FileProblem, read_regular
from otel_vgpu.gpu.backend import Device

# A ratio file is one number; anything this large is not one, and reading it
# whole would cost memory for nothing.
MAX_FILE_BYTES = 64 * 1024
AUTO = "auto"
MAX_RATIO = 1024
# A ratio file that reads bad within this long of its last change is taken for a write in
# progress (an editor or `echo 4 >` writing in place), not yet for a bad file.
SETTLE_S = 2.0
_NUMBER = re.compile(r"[0-9]+(\.[0-9]+)?")
_VALID = (
    f"expected one whole number from 1 to {MAX_RATIO} in ASCII digits, the vGPUs per physical GPU (for example 2), "
    "or auto (the kubelet's replica counts)"
)


class RatioFileError(ValueError):
    """A ratio file that cannot be used. The message is one line for the user."""


def parse_ratio(text: str, source: str = "gpu_allocation.txt") -> float | None:
    """The ratio in `text`, None for `auto`; `source` names the file in error messages."""
    found: tuple[int, str] | None = None
    for number, raw_line in enumerate(text.splitlines(), start=1):
        value = raw_line.split("#", 1)[0].strip()
        if not value:
            continue
        if found is not None:
            raise RatioFileError(
                f"{source}:{number}: second value {value!r} (the first is {found[1]!r} on line {found[0]}); {_VALID}"
            )
        found = (number, value)
    if found is None:
        raise RatioFileError(f"{source}: no value (the file is empty or only comments); {_VALID}")
    number, value = found
    if value.lower() == AUTO:
        return None
    # Only plain ASCII decimals: float() would also take full-width or Arabic-Indic
    # digits, "1_000", "+2", "1e308" and "nan".
    if not _NUMBER.fullmatch(value):
        raise RatioFileError(f"{source}:{number}: {value!r} is not a number; {_VALID}")
    ratio = float(value)
    if not ratio.is_integer():
        # A vGPU is a replica the device plugin advertises (GPU-<uuid>::n): there is no
        # half of one. "2.0" is 2, as before.
        raise RatioFileError(f"{source}:{number}: {value!r} is not a whole number; {_VALID}")
    if ratio < 1:
        raise RatioFileError(f"{source}:{number}: {value!r} is below 1; {_VALID}")
    if ratio > MAX_RATIO:
        raise RatioFileError(f"{source}:{number}: {value!r} is above {MAX_RATIO}; {_VALID}")
    return ratio


def read_ratio(path: Path, name: str | None = None) -> float | None:
    """Read and parse the ratio file; every failure is a RatioFileError. `name`: how the
    messages name the file (at start, the flag and its value); its path where None."""
    named = name or str(path)
    try:
        # Non-blocking, a regular file only, under a bound (otel_vgpu/files.py): a FIFO
        # in its place would otherwise block the sweep that reads it, for good.
        data = read_regular(path, MAX_FILE_BYTES)
    except FileProblem as problem:
        what = f"{problem.what}, not a ratio file" if problem.what.startswith("is larger") else problem.what
        raise RatioFileError(f"{named}: {what}; {_VALID}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise RatioFileError(f"{named}:{line}: not UTF-8 text; {_VALID}") from None
    return parse_ratio(text, named)


@dataclass(frozen=True, slots=True)
class _Stamp:
    device: int
    inode: int
    size: int
    mtime_ns: int


class RatioSource:
    """The ratio in force, reloaded when the file changes.

    A stat per collection is all it costs while nothing changes. The stat
    follows symlinks, so a ConfigMap's `..data` swap (a new inode behind the
    same path) is seen as a change.
    """

    def __init__(self, path: Path, fallback: float | None = None, name: str | None = None) -> None:
        """`fallback`: the ratio while no file is at `path` (the simulated node's);
        without one, a missing file is an error. A file that appears later is read.
        `name`: how the first read's messages name the file (read_ratio)."""
        self.path = path
        self._stamp = self._stat()
        self.origin = str(path)
        """Where the ratio in force comes from, for the log."""
        if fallback is not None and self._stamp is None:
            self.ratio: float | None = fallback
            self.origin = f"the simulated node (no {path})"
        else:
            self.ratio = read_ratio(path, name)
        """The number in the file; None for `auto`."""
        self.error: RatioFileError | None = None
        """Why the file on disk is not in force, while it is bad."""
        self._known: dict[str, int] = {}
        """The last replica count the kubelet gave for each device."""

    def describe(self) -> str:
        return AUTO if self.ratio is None else f"{self.ratio:g}"

    def ratios(self, gpus: Sequence[Device], replicas: Mapping[str, int] | None) -> Resolved:
        """The ratio of each GPU and MIG device, from the file and the
        kubelet's replica counts (None: the kubelet has not answered)."""
        if replicas is not None:
            self._known.update(replicas)
        return resolve_ratios(self.ratio, gpus, replicas, self._known)

    def refresh(self) -> None:
        """Reload the file if it changed. A bad file leaves the last good
        ratio in force and sets `error` until the file is good again."""
        stamp = self._stat()
        if stamp == self._stamp:
            return
        try:
            ratio = read_ratio(self.path)
        except RatioFileError as error:
            if stamp is not None and time.time() - stamp.mtime_ns / 1e9 < SETTLE_S:
                # Changed a moment ago: most likely written in place and caught between its
                # truncation and its last write(). Not a failure yet: read again on the next
                # refresh (the stamp is not taken), and only a file still bad SETTLE_S after
                # its last change is reported, once.
                return
            self._stamp = stamp
            self.error = error
        else:
            self._stamp = stamp
            self.ratio = ratio
            self.error = None
            self.origin = str(self.path)

    def _stat(self) -> _Stamp | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return _Stamp(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


@dataclass(frozen=True, slots=True)
class Ratios:
    """The ratio in force for each device: vGPUs it is presented as."""

    default: float = 1.0
    per_device: Mapping[str, float] = field(default_factory=dict)

    def of(self, device_uuid: str) -> float:
        return self.per_device.get(device_uuid, self.default)


@dataclass(frozen=True, slots=True)
class Resolved:
    ratios: Ratios
    problems: tuple[tuple[str, str], ...] = ()
    """(kind, message): a number that disagrees with the kubelet, or a count not known."""


def resolve_ratios(
    ratio: float | None,
    gpus: Sequence[Device],
    replicas: Mapping[str, int] | None,
    known: Mapping[str, int],
) -> Resolved:
    """Each device's ratio.

    - A number: every whole GPU has it; one whose replica count from the
      kubelet differs is a problem (the number stays in force).
    - `auto`: each whole GPU's replica count from the kubelet. A GPU the
      kubelet answered without (not shared through a device plugin: DRA,
      MIG mode) has 1. While the kubelet has not answered, the last count
      it gave, else 1, which is a problem.
    - A MIG device has its replica count from the kubelet whatever the file
      says (the number is per physical GPU), else the last known, else 1.
    """
    per: dict[str, float] = {}
    problems: list[tuple[str, str]] = []
    for gpu in gpus:
        for mig in gpu.migs:
            per[mig.uuid] = float((replicas or {}).get(mig.uuid) or known.get(mig.uuid, 1))
        count = None if replicas is None else replicas.get(gpu.uuid)
        if ratio is not None:
            per[gpu.uuid] = ratio
            if count is not None and count != ratio:
                problems.append(
                    (
                        f"mismatch:{gpu.uuid}",
                        f"gpu_allocation.txt says {ratio:g} vGPUs per GPU but the kubelet advertises {count} "
                        f"replicas of GPU {gpu.index} ({gpu.uuid}); using {ratio:g} (write auto to follow the kubelet)",
                    )
                )
        elif count is not None:
            per[gpu.uuid] = float(count)
        elif replicas is not None or gpu.mig_mode:
            per[gpu.uuid] = 1.0
        elif gpu.uuid in known:
            per[gpu.uuid] = float(known[gpu.uuid])
        else:
            per[gpu.uuid] = 1.0
            problems.append(
                (
                    f"unknown:{gpu.uuid}",
                    f"ratio auto: the kubelet has not said how many replicas GPU {gpu.index} ({gpu.uuid}) has; "
                    "using 1 until it does",
                )
            )
    return Resolved(Ratios(ratio if ratio is not None else 1.0, per), tuple(problems))
