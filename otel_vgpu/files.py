"""Reading the files the agent is given: the ratio, the users, the TLS PEMs, a scenario.

Each is opened without blocking, must be a regular file, and is read under a
bound. A FIFO in a file's place would otherwise block its reader for good (a
users file's thread stops rereading, a start never listens), and a link to
/dev/zero would be read until memory runs out. Whatever else is found is a
`FileProblem` naming the file and what it is, which each caller words for its
flag.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

# A certificate chain, key or CA bundle is far smaller; past this a TLS file is not one.
MAX_PEM_BYTES = 1024 * 1024
# What a node gives a file kind by kind, in words.
_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class FileProblem(ValueError):
    """A file that cannot be used as one: `what` says why, in a few words."""

    def __init__(self, path: Path, what: str) -> None:
        super().__init__(f"{path}: {what}")
        self.path = path
        self.what = what


def read_regular(path: Path, max_bytes: int) -> bytes:
    """The whole of the regular file at `path` (links followed), at most `max_bytes`."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise FileProblem(path, "no such file") from None
    except IsADirectoryError:
        raise FileProblem(path, "is a directory, not a regular file") from None
    except OSError as error:
        raise FileProblem(path, f"cannot be read ({error.strerror or error})") from None
    try:
        mode = os.fstat(descriptor).st_mode
        for test, kind in _KINDS:
            if test(mode):
                raise FileProblem(path, f"is {kind}, not a regular file")
        chunks = []
        left = max_bytes + 1
        while left > 0:
            chunk = os.read(descriptor, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as error:
        raise FileProblem(path, f"cannot be read ({error.strerror or error})") from None
    finally:
        os.close(descriptor)
    data = b"".join(chunks)
    if len(data) > max_bytes:
        raise FileProblem(path, f"is larger than {max_bytes} bytes")
    return data
