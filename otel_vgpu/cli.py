"""Command line: flags into a `Config`, then the agent until SIGTERM or SIGINT."""

from __future__ import annotations

import logging
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any

from otel_vgpu.agent import Agent, StartupError
from otel_vgpu.config import EXIT_USAGE, Config, ConfigError, parse_config
from otel_vgpu.export.memory import quiet_collector, return_freed_memory

log = logging.getLogger("otel_vgpu")


def main(argv: Sequence[str] | None = None, adjust: Callable[[Config], Config] = lambda config: config) -> int:
    """`adjust`: what becomes of the configuration the flags give (tests shorten its timers and limits)."""
    try:
        config = adjust(parse_config(argv))
    except ConfigError as error:
        print(f"otel-vgpu: error: {error} (see --help)", file=sys.stderr)
        return EXIT_USAGE
    logging.basicConfig(
        level=config.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
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
    stop.wait()
    agent.stop()
    return agent.exit_status
