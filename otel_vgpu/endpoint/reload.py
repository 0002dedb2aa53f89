"""The endpoint's credentials, reread when their files change.

A certificate renewed by cert-manager, a password revoked in a Secret: a
Secret volume is updated in place (the kubelet swaps a `..data` link, as for
a ConfigMap), and the agent must serve the new files without a restart. Each
watched group of files (the TLS certificate, key and client CA; the users
file) is looked at every few seconds by its files' identity (device, inode,
size, modification and change times, through links), loaded whole when it changes, and
put in force only if it loads: a bad new version keeps the old one in force,
is logged once with why, and is counted (`stage="credentials"`) each time it
is looked at, until the files change again.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from otel_vgpu.agent_health import AgentHealth, Stage
from otel_vgpu.threads import NamedThread

log = logging.getLogger(__name__)

CHECK_EVERY_S = 2.0

Signature = tuple[tuple[int, int, int, int, int] | None, ...]


def signature(paths: Sequence[Path]) -> Signature:
    """What identifies the files' present versions; None for one that cannot be looked at.
    The change time is in it: a file rewritten in place to the same size, its modification
    time set back (`touch -d`, `cp -p`), keeps every other field, and a revoked password
    would stay in force; the kernel sets the change time on every write, and no call sets
    it back."""
    found: list[tuple[int, int, int, int, int] | None] = []
    for path in paths:
        try:
            stat = os.stat(path)
        except OSError:
            found.append(None)
        else:
            found.append((stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns))
    return tuple(found)


@dataclass
class Watched:
    """One group of files loaded together, and what to do with what they load to."""

    what: str
    """For people: `the TLS certificate and key`, `the users file`."""
    paths: Sequence[Path]
    load: Callable[[], Any]
    """Raises ValueError with one line when the files cannot be used."""
    apply: Callable[[Any], None]
    seen: Signature = field(default=())
    bad: bool = False
    """The files' present version could not be used (the previous one is in force)."""


class CredentialWatch:
    """Looks at each watched group every `every_s` seconds, on a thread of its own."""

    def __init__(self, groups: Sequence[Watched], health: AgentHealth, every_s: float = CHECK_EVERY_S) -> None:
        self._groups = list(groups)
        for group in self._groups:
            group.seen = signature(group.paths)
        self._health = health
        self._every_s = every_s
        self._stop = threading.Event()
        self._thread = NamedThread(target=self._run, name="credentials", daemon=True)

    def start(self) -> None:
        if self._groups:
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self._every_s):
            for group in self._groups:
                self.check(group)

    def check(self, group: Watched) -> None:
        now = signature(group.paths)
        if now == group.seen:
            if group.bad:
                self._health.count(Stage.CREDENTIALS)  # still bad: counted while it stays so
            return
        group.seen = now
        try:
            loaded = group.load()
        except ValueError as error:
            # Half of a Secret's files may be new and half old for a moment; the next look
            # sees the whole. The old credentials stay in force meanwhile.
            self._health.count(Stage.CREDENTIALS)
            if not group.bad:
                log.warning("%s changed and cannot be used (%s); keeping the previous version", group.what, error)
            group.bad = True
            return
        group.apply(loaded)
        group.bad = False
        log.info("%s reread: the new version is in force", group.what)
