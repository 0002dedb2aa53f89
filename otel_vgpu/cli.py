"""Command line: flags into a `Config`, then the agent until SIGTERM or SIGINT."""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

from otel_vgpu.agent import Agent, StartupError
from otel_vgpu.config import EXIT_USAGE, Config, ConfigError, parse_config
from otel_vgpu.logs import configure as configure_logging
from otel_vgpu.memory import quiet_collector, return_freed_memory

log = logging.getLogger("otel_vgpu")

# How often the main thread looks whether the agent has stopped itself (a driver it cannot use
# any more); a signal wakes it at once.
STOP_CHECK_S = 1.0


def main(argv: Sequence[str] | None = None, adjust: Callable[[Config], Config] = lambda config: config) -> int:
    """`adjust`: what becomes of the configuration the flags give (tests shorten its timers and limits)."""
    try:
        config = adjust(parse_config(argv))
    except ConfigError as error:
        print(f"otel-vgpu: error: {error} (see --help)", file=sys.stderr)
        return EXIT_USAGE
    configure_logging(config.log_level, config.log_format)
    for renamed in config.renamed:
        log.warning("%s", renamed.warning(), extra={"variable": renamed.old, "replacement": renamed.new})
    # The HTTP clients log every request at INFO: a watch every few minutes,
    # a list after each outage. Their failures reach the agent's own log.
    for noisy in ("httpx", "httpx2", "httpcore", "httpcore2"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLogger().level))
    return_freed_memory()
    try:
        agent = Agent(config)
    except StartupError as error:
        print(f"otel-vgpu: error: {error}", file=sys.stderr)
        return error.status

    stop = agent.stopping

    def on_signal(signum: int, frame: Any) -> None:
        log.info("received %s, shutting down", signal.Signals(signum).name)
        stop.set()

    def on_other(signum: int, frame: Any) -> None:
        # Their default would kill the agent and leave the simulated node's
        # proc tree behind; nothing needs them: files are reread when they change.
        log.info("received %s: ignored (the ratio file is reread when it changes)", signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    for other in (signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(other, on_other)
    agent.start()
    quiet_collector()
    wait_for_stop(stop)
    agent.stop()
    return agent.exit_status


def wait_for_stop(stop: threading.Event) -> None:
    """Return once `stop` is set: by the handler of SIGTERM or SIGINT, or by the agent itself.

    Not `stop.wait()`: Python runs a signal's handler on the main thread only, once that thread
    runs again, and the kernel may run the C handler that notes the signal on another of the
    agent's threads, or on this one just before it goes to sleep. Asleep in the Event's lock
    with no timeout, nothing woke it, and the agent outlived SIGTERM until a second signal came
    (a few times in some hundreds of stops on a loaded machine). Python writes each signal to the
    wakeup descriptor from whichever thread notes it, so select() returns and the handler runs;
    and the handler's `stop.set()` never finds this thread inside the Event's lock, which it
    would wait for forever.
    """
    read_end, write_end = os.pipe()
    os.set_blocking(read_end, False)
    os.set_blocking(write_end, False)
    previous = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    try:
        while not stop.is_set():
            select.select([read_end], [], [], STOP_CHECK_S)
            with contextlib.suppress(BlockingIOError):
                os.read(read_end, 64)
    finally:
        signal.set_wakeup_fd(previous)
        os.close(read_end)
        os.close(write_end)
