"""List, then watch: one kind of Kubernetes object kept current by a background thread.

A loop lists the selected objects, then watches from the list's
resourceVersion; after `410 Gone`, a broken watch or any error it lists
again, with exponential backoff. A watchdog takes a watch that has said
nothing for 1.2 times its timeout plus a grace for hung (a half-open
connection the server never closes) and starts a new loop on a new client.
Each loop has a generation: what a superseded loop lists or hears is dropped.

The owner sees the objects through two callbacks, called with the loop's
lock held so that a superseded loop's results never land: `on_list` with
every object of a list, `on_event` with each watch event. The pod directory
(pods of this node, kubernetes/api.py), the driver upgrade's watch of this node's
labels (kubernetes/driver_upgrade.py) and KAI's BindRequests
(kubernetes/bind_requests.py) are its users.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from otel_vgpu.agent_health import AgentHealth, Reader, Stage
from otel_vgpu.config import DEFAULT_BACKOFF, Backoff
from otel_vgpu.threads import NamedThread

log = logging.getLogger(__name__)

# The API server closes a watch after this long; the loop then lists again
# only if the watch broke, otherwise it resumes from the last resourceVersion.
WATCH_SECONDS = 300


@dataclass(frozen=True, slots=True)
class WatchSettings:
    """What every watch of this node's objects shares: the API client, the node, where its
    failures are counted, and its timers."""

    make_client: Callable[[], Any]
    node_name: str
    health: AgentHealth = field(default_factory=AgentHealth)
    watch_seconds: int = WATCH_SECONDS
    """What the API server is asked to keep a watch open for."""
    backoff: Backoff = DEFAULT_BACKOFF
    """Between lists of a failing API."""
    watch_grace_s: float = 5.0
    """A watch silent for 1.2 x watch_seconds plus this long is taken for hung."""


class ListWatch:
    def __init__(
        self,
        settings: WatchSettings,
        resource: Any,
        *,
        what: str,
        fields: Mapping[str, str],
        namespace: str | None,
        on_list: Callable[[list[Any]], None],
        on_event: Callable[[str, Any], None],
        on_failure: Callable[[Exception], None],
        stage: Stage,
        reader: Reader,
        labels: Mapping[str, str] | None = None,
    ) -> None:
        """`resource`: the lightkube class (Pod, Node); `what` names the
        selection in logs and thread names; `stage` is where a hung watch is
        counted (failures are the owner's to report, through `on_failure`);
        `reader` is whose passes its lists are: each list's duration, and
        whether it answered, until a failed list or a broken watch says not."""
        self._settings = settings
        self._resource = resource
        self._what = what
        self._fields = dict(fields)
        self._labels = dict(labels) if labels else None
        self._namespace = namespace
        self._on_list = on_list
        self._on_event = on_event
        self._on_failure = on_failure
        self._stage = stage
        self._reader = reader
        self._listed_s = 0.0
        """How long the last list took, answered or not."""
        self._client: Any = None
        self._generation = 0
        self._progress = time.monotonic()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.synced = threading.Event()
        """Set once a list has succeeded."""
        # A list or watch event must come within this long, or the watch is
        # taken for hung: the loop lists again on a new connection. On a
        # quiet node that is one extra list every few minutes.
        self._silence_limit = settings.watch_seconds * 1.2 + settings.watch_grace_s
        self._watchdog = NamedThread(target=self._watch_the_watch, name=f"watchdog-{what}", daemon=True)

    def start(self) -> None:
        self._begin()
        self._watchdog.start()

    def stop(self) -> None:
        self._stop.set()
        _give_up(self._client)

    def _begin(self) -> None:
        """A new list-and-watch loop on a new client; the previous loop's
        results are ignored from now on."""
        with self._lock:
            self._generation += 1
            generation = self._generation
            old, self._client = self._client, self._settings.make_client()
            self._progress = time.monotonic()
        if old is not None:
            _give_up(old)
        client = self._client
        NamedThread(
            target=self._run, args=(client, generation), name=f"kubernetes-{self._what}-{generation}", daemon=True
        ).start()

    def _watch_the_watch(self) -> None:
        while not self._stop.wait(min(5.0, self._silence_limit / 4)):
            silent = time.monotonic() - self._progress
            if self.synced.is_set() and not self._settings.health.failing(self._stage) and silent > self._silence_limit:
                # Counted and logged each time: a hung watch is an event, not an outage.
                self._settings.health.count(self._stage)
                self._settings.health.passed(self._reader, self._listed_s, False)
                log.warning(
                    "no word from the Kubernetes API watch of %s for %.0f s; listing again on a new connection",
                    self._what,
                    silent,
                )
                self._begin()

    def _current(self, generation: int) -> bool:
        return generation == self._generation and not self._stop.is_set()

    def _run(self, client: Any, generation: int) -> None:
        try:
            self._loop(client, generation)
        finally:
            # Closed by the thread that reads it, once it has stopped reading (_give_up).
            with contextlib.suppress(Exception):
                client.close()

    def _loop(self, client: Any, generation: int) -> None:
        first, most = self._settings.backoff.first, self._settings.backoff.most
        backoff = first
        while self._current(generation):
            try:
                version = self._list(client, generation)
                backoff = first
                self._watch(client, generation, version)
            except Exception as error:  # any failure of the API means: list again later
                if not self._current(generation):
                    return
                if status_of(error) == 410:
                    log.debug("watch of %s expired (410 Gone); listing again", self._what)
                    continue
                # A list that failed, or the watch after a list broke: failed until a list answers.
                self._settings.health.passed(self._reader, self._listed_s, False)
                self._on_failure(error)
                self._stop.wait(backoff)
                backoff = min(most, backoff * 2)

    def _list(self, client: Any, generation: int) -> str:
        started = time.monotonic()
        try:
            listing = client.list(self._resource, namespace=self._namespace, fields=self._fields, labels=self._labels)
            items = list(listing)
        finally:
            self._listed_s = time.monotonic() - started
        with self._lock:
            if generation != self._generation:
                raise _Superseded
            self._on_list(items)
            self._progress = time.monotonic()
        self._settings.health.passed(self._reader, self._listed_s, True)
        self.synced.set()
        version: str = listing.resourceVersion
        return version

    def _watch(self, client: Any, generation: int, version: str) -> None:
        events = client.watch(
            self._resource,
            namespace=self._namespace,
            fields=self._fields,
            labels=self._labels,
            resource_version=version,
            server_timeout=self._settings.watch_seconds,
        )
        for kind, obj in events:
            with self._lock:
                if generation != self._generation or self._stop.is_set():
                    return
                self._progress = time.monotonic()
                self._on_event(kind, obj)


def _give_up(client: Any) -> None:
    """Wake the loop reading `client` so that it ends and closes it itself. A client of
    make_client's shuts its watches' sockets down; another (a test's) is closed here."""
    if client is None:
        return
    interrupt = getattr(client, "otel_vgpu_interrupt", None)
    with contextlib.suppress(Exception):
        if interrupt is not None:
            interrupt()
        else:
            client.close()


class _Superseded(Exception):
    """A loop the watchdog replaced finished a list: its result is dropped."""


def status_of(error: Exception) -> int | None:
    """The HTTP status of a lightkube API error, else None."""
    status = getattr(error, "status", None)
    code = getattr(status, "code", None)
    return int(code) if isinstance(code, int) else None


def describe(error: Exception) -> str:
    text = str(error) or type(error).__name__
    return text.splitlines()[0][:200]


def report_failure(health: AgentHealth, stage: Stage, error: Exception, refused: str, failed: str) -> None:
    """Count a failed list or watch and log it once per kind: `refused` (with
    the status put in) when the API refused the agent, else `failed`."""
    status = status_of(error)
    if status in (401, 403):
        message = refused.format(status=status)
    else:
        message = f"{failed} ({describe(error)}); retrying with backoff"
    health.failed(stage, f"{type(error).__name__}:{status}", message)
