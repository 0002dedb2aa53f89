"""Running the agent as a process, the way a user does."""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import itertools
import logging
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from otel_vgpu.config import Backoff, parse_config
from testkit.promtext import Exposition, parse

ROOT = Path(__file__).resolve().parents[1]


def tool(name: str) -> str | None:
    """A command-line tool, from this virtual environment first (the test
    extra installs hadolint and kubectl there), else from PATH."""
    local = Path(sys.executable).parent / name
    if local.exists():
        return str(local)
    return shutil.which(name)


# Ports handed to the servers tests start: below Linux's ephemeral range (32768-60999, where
# every client socket of the session takes its port, and the kernel's choice for port 0), in
# a block of its own per pytest-xdist worker, each port once per process. A session without
# workers has the last block: scripts/test.sh runs the hostile-client tests so beside the
# xdist workers, and a port both handed out was answered by the other's server (the check
# below finds a port free before either binds it).
PORT_BLOCK = 1000
FIRST_PORT = 20_000
BLOCKS = 12
_ports = itertools.count()


def free_port() -> int:
    """A port no other test of the session, nor of a session running beside it, is given,
    free when asked."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "").removeprefix("gw")
    block = int(worker) % (BLOCKS - 1) if worker.isdigit() else BLOCKS - 1
    base = FIRST_PORT + block * PORT_BLOCK
    for _ in range(PORT_BLOCK):
        port = base + next(_ports) % PORT_BLOCK
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise AssertionError(f"no free port in {base}-{base + PORT_BLOCK - 1}")


def command(*args: str) -> list[str]:
    return [sys.executable, "-m", "otel_vgpu", *args]


def launched(*args: str) -> list[str]:
    """The agent's command line through testkit.launch: its timers and limits from TESTKIT_CONFIG."""
    return [sys.executable, "-m", "testkit.launch", *args]


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_") and k != "NODE_NAME"}
    env.update(extra)
    return env


def run_to_exit(
    args: Sequence[str], env: dict[str, str] | None = None, timeout: float = 20
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command(*args), capture_output=True, text=True, timeout=timeout, env=env or clean_env(), cwd=ROOT, check=False
    )


def swept_per_scrape(scenario: Path | str | None, ratio_file: Path, *extra: str) -> list[str]:
    """The agent's flags on a simulated node (`scenario`; None: the built-in one) whose every
    collection sweeps, with no sweeps of its own: each scrape reads a sweep of its moment."""
    simulate = ["--simulate"] if scenario is None else ["--simulate", str(scenario)]
    return [*simulate, "--allocation-file", str(ratio_file), "--sweep-interval", "0", "--min-interval", "0", *extra]


def get(url: str, headers: dict[str, str] | None = None, timeout: float = 10) -> tuple[int, bytes, dict[str, str]]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read(), dict(response.headers)
    except urllib.error.HTTPError as error:
        return error.code, error.read(), dict(error.headers)


@dataclass
class Agent:
    process: subprocess.Popen[str]
    url: str

    def scrape(self) -> Exposition:
        status, body, _ = get(f"{self.url}/metrics")
        assert status == 200
        return parse(body.decode())

    def stop(self) -> tuple[int, str]:
        self.process.send_signal(signal.SIGTERM)
        try:
            _, err = self.process.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise
        return self.process.returncode, err


def _healthy(url: str, https_ca: Path | None, https_client: Any) -> bool:
    if https_ca is None:
        return get(f"{url}/healthz", timeout=1)[0] == 200
    context = ssl.create_default_context(cafile=str(https_ca))
    if https_client is not None:
        context.load_cert_chain(https_client.client_cert, https_client.client_key)
    host, port = url.removeprefix("http://").split(":")
    connection = http.client.HTTPSConnection(host, int(port), context=context, timeout=1)
    try:
        connection.request("GET", "/healthz")
        return connection.getresponse().status == 200
    finally:
        connection.close()


@contextmanager
def running_agent(
    *args: str, env: dict[str, str] | None = None, https_ca: Path | None = None, https_client: Any = None
) -> Iterator[Agent]:
    """The agent on a free port; `url` is http://127.0.0.1:<port> even when it serves HTTPS."""
    port = free_port()
    process = subprocess.Popen(
        command("--address", "127.0.0.1", "--port", str(port), *args),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env or clean_env(),
        cwd=ROOT,
    )
    agent = Agent(process, f"http://127.0.0.1:{port}")
    try:
        wait_serving(
            lambda: _healthy(agent.url, https_ca, https_client),
            process,
            lambda: process.stderr.read() if process.stderr else "",
        )
        yield agent
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()


# Timers for an agent run in process: what takes seconds on a node takes a
# fraction of one here, so failure and recovery paths run in tenths of a second.
SHORT_TIMERS = {"kube_backoff": Backoff(0.05, 0.4), "kube_watch_grace_s": 0.5, "first_sync_wait_s": 0.5}


class _Log(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


@dataclass
class InProcessAgent:
    """The agent built from flags in this process, with short timers: `stop()`
    answers like a process's (exit status, log)."""

    agent: Any
    url: str
    log: _Log

    def scrape(self) -> Exposition:
        status, body, _ = get(f"{self.url}/metrics")
        assert status == 200
        return parse(body.decode())

    def logged(self) -> str:
        return "\n".join(self.log.lines)

    def wait_sweeps(self, count: int, timeout: float = 30) -> None:
        """Back once the agent has made `count` more sweeps (its own cadence, or scrapes')."""
        target = self.agent.sampler.sweeps + count
        wait_until(lambda: self.agent.sampler.sweeps >= target, what=f"{count} sweeps", timeout=timeout)

    def stop(self) -> tuple[int, str]:
        self.agent.stop()
        return 0, self.logged()


@contextmanager
def agent_in_process(*args: str, env: dict[str, str], **overrides: Any) -> Iterator[InProcessAgent]:
    """The agent of `args` and `env`, in this process, SHORT_TIMERS unless overridden.

    The Kubernetes client reads KUBERNETES_SERVICE_* from the process's
    environment, so those of `env` are set for the agent's life."""
    from otel_vgpu.agent import Agent  # noqa: PLC0415

    port = free_port()
    config = parse_config(["--address", "127.0.0.1", "--port", str(port), *args], env)
    config = dataclasses.replace(config, **{**SHORT_TIMERS, **overrides})
    kube = {k: v for k, v in env.items() if k.startswith("KUBERNETES_SERVICE_")}
    saved = {k: os.environ.get(k) for k in kube}
    os.environ.update(kube)
    handler = _Log()
    logger = logging.getLogger("otel_vgpu")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    agent = None
    try:
        agent = Agent(config)
        agent.start()
        yield InProcessAgent(agent, f"http://127.0.0.1:{port}", handler)
    finally:
        if agent is not None:
            with contextlib.suppress(Exception):
                agent.stop()
        logger.removeHandler(handler)
        logger.setLevel(level)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def wait_serving(
    healthy: Callable[[], bool] | str,
    process: subprocess.Popen[Any],
    log: Callable[[], str] = lambda: "",
    timeout: float = 30,
) -> None:
    """Wait until the agent answers its health probe (a check, or a base URL
    whose /healthz is asked); fail with its log if it exits or stays silent."""
    check = healthy if callable(healthy) else (lambda: get(f"{healthy}/healthz", timeout=1)[0] == 200)
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            raise AssertionError(f"the agent exited with {process.returncode}: {log()}")
        try:
            if check():
                return
        except (OSError, http.client.HTTPException):
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"the agent did not serve within {timeout:g} s: {log()}")
        time.sleep(0.05)


def wait_for(agent: Agent | InProcessAgent, predicate: Callable[[Exposition], bool], timeout: float = 15) -> Exposition:
    """Scrape until `predicate` holds for a scrape; that scrape."""
    deadline = time.monotonic() + timeout
    while True:
        exposition = agent.scrape()
        if predicate(exposition):
            return exposition
        assert time.monotonic() < deadline, "condition not met; last scrape: " + repr(
            exposition.series("vgpu_pod_memory_used_bytes")
        )
        time.sleep(0.05)


def wait_until(condition: Callable[[], Any], timeout: float = 15, what: str = "condition") -> Any:
    """Poll `condition` until it returns something true; that value."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what} not met within {timeout} s"
        time.sleep(0.05)
