"""The node's virtualization ratio, from `gpu_allocation.txt`.

The format is the original exporter's: one positive number, the count of
vGPUs each physical GPU is presented as (`2` = two vGPUs per GPU). Comments
(`#` to the end of the line) and blank lines are allowed. The file is reread
when it changes, so a ConfigMap update takes effect without a restart; a bad
change keeps the last good ratio.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

# A ratio file is one number; anything this large is not one, and reading it
# whole would cost memory for nothing.
MAX_FILE_BYTES = 64 * 1024
_VALID = "expected one number >= 1, the vGPUs per physical GPU (for example 2)"


class RatioFileError(ValueError):
    """A ratio file that cannot be used. The message is one line for the user."""


def parse_ratio(text: str, source: str = "gpu_allocation.txt") -> float:
    """The ratio in `text`; `source` names the file in error messages."""
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
    try:
        ratio = float(value)
    except ValueError:
        raise RatioFileError(f"{source}:{number}: {value!r} is not a number; {_VALID}") from None
    if math.isnan(ratio) or math.isinf(ratio):
        raise RatioFileError(f"{source}:{number}: {value!r} is not a finite number; {_VALID}")
    if ratio < 1:
        raise RatioFileError(f"{source}:{number}: {value!r} is below 1; {_VALID}")
    return ratio


def read_ratio(path: Path) -> float:
    """Read and parse the ratio file; every failure is a RatioFileError."""
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise RatioFileError(f"{path}: no such file; {_VALID}") from None
    except IsADirectoryError:
        raise RatioFileError(f"{path}: is a directory, not a file; {_VALID}") from None
    except OSError as error:
        raise RatioFileError(f"{path}: cannot be read ({error.strerror}); {_VALID}") from None
    if len(data) > MAX_FILE_BYTES:
        raise RatioFileError(f"{path}: larger than {MAX_FILE_BYTES} bytes, not a ratio file; {_VALID}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise RatioFileError(f"{path}:{line}: not UTF-8 text; {_VALID}") from None
    return parse_ratio(text, str(path))


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

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp = self._stat()
        self.ratio = read_ratio(path)
        self.error: RatioFileError | None = None
        """Why the file on disk is not in force, while it is bad."""

    def refresh(self) -> None:
        """Reload the file if it changed. A bad file leaves the last good
        ratio in force and sets `error` until the file is good again."""
        stamp = self._stat()
        if stamp == self._stamp:
            return
        self._stamp = stamp
        try:
            self.ratio = read_ratio(self.path)
        except RatioFileError as error:
            self.error = error
        else:
            self.error = None

    def _stat(self) -> _Stamp | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return _Stamp(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
