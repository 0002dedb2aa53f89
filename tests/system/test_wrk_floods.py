"""Floods of wrk (a C client) against the agent, a legitimate scraper of another /24 beside
them (issue 45): what one address opening connections as fast as they are answered, or 253
fresh addresses of the scraper's own /24 sending wrong passwords, leave the scraper.

The agent runs alone on a CPU where the machine has two (testkit/wrk.py), at the machine's
priority (scripts/test.sh runs this file in the hostile-client lane); wrk on the other. Each
flood holds the cap, or the password checks' queue, before the scraper starts; the scraper
then scrapes `FAIR_SCRAPES` times through it, every quarter of a second, and at least 9 of
its scrapes in 10 must be answered. What is asserted is that property, never a rate: a
slow machine makes every scrape slower, attacker's and scraper's alike, and the scrapes
are counted, not timed (each within its client's 5 s timeout).
"""

from __future__ import annotations

import base64
import ssl
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import bcrypt
import pytest

from testkit.agent import wait_serving, wait_until
from testkit.certs import make_certs
from testkit.hostile import (
    FAIR_SCRAPES,
    LIMITS,
    Scraper,
    agent,
    assert_bounded,
    attack_while_scraped,
    fds,
    scraped_nine_in_ten,
    settle,
    warm,
)
from testkit.wrk import flood, pinned

SCRAPER = "127.99.0.50"
"""The scraper's address: another /24 than the flood's (127.0.0.1, wrk's)."""
SECRET = b"prometheus:scrape-secret"


@dataclass(frozen=True)
class Attack:
    path: str
    connections: int
    keep_alive: bool = False
    credential: str | None = None
    """None, "password" (basic auth; the flood's wrong) or "certificate" (mutual TLS; the flood sends none)."""


ATTACKS = {
    "metrics-close": Attack("/metrics", 256),
    "healthz-close": Attack("/healthz", 512),
    "password-close": Attack("/metrics", 256, credential="password"),
    "certificate-close": Attack("/metrics", 256, credential="certificate"),
    "metrics-keep-alive": Attack("/metrics", 256, keep_alive=True),
}


@pytest.mark.parametrize("name", list(ATTACKS))
def test_one_address_flooding_cannot_lock_a_scraper_of_another_network_out(tmp_path: Path, name: str) -> None:
    # wrk from 127.0.0.1: a fresh connection per request (Connection: close) or kept alive,
    # as many connections as the cap, the admission queue and the accept backlog hold
    # (256), or twice that. Before issue 45 a scraper of another /24 got 3 scrapes in 25
    # (/metrics), 0 in 13 (/healthz), 1 in 25 (basic auth), 0 in 5 (mutual TLS, the
    # agent's memory 35.8 -> 133 MiB) and 14 in 25 (kept alive, scrapes shed as tricklers).
    attack = ATTACKS[name]
    extra: tuple[str, ...] = ()
    context: ssl.SSLContext | None = None
    auth = None
    headers: tuple[str, ...] = () if attack.keep_alive else ("Connection: close",)
    if attack.credential == "certificate":
        certs = make_certs(tmp_path / "pki")
        extra = ("--tls-cert-file", str(certs.cert), "--tls-key-file", str(certs.key))
        extra += ("--tls-client-ca-file", str(certs.ca))
        context = ssl.create_default_context(cafile=str(certs.ca))
        context.load_cert_chain(certs.client_cert, certs.client_key)
    if attack.credential == "password":
        users = tmp_path / "users"
        users.write_text("prometheus:" + bcrypt.hashpw(b"scrape-secret", bcrypt.gensalt(rounds=10)).decode() + "\n")
        extra = ("--basic-auth-file", str(users))
        auth = "Basic " + base64.b64encode(SECRET).decode()
        headers += ("Authorization: Basic " + base64.b64encode(b"prometheus:a-wrong-one").decode(),)
    with agent(tmp_path, *extra, prefix=pinned()) as target:
        url = target.url.replace("http://", "https://") if context else target.url
        scraper = Scraper(url, context=context, auth=auth, source=SCRAPER)
        baseline = warm(scraper, target)
        with flood(url + attack.path, attack.connections, headers) as load:
            established = threading.Event()

            def under_way() -> None:
                # The cap full of the flood's connections (their descriptors), then the scrapes.
                wait_until(
                    lambda: fds(target.pid) >= baseline.fds + LIMITS.connections, what="the flood holding the cap"
                )
                established.set()
                wait_until(lambda: len(scraper.durations) >= FAIR_SCRAPES, what="the scrapes", timeout=90)

            peak = attack_while_scraped(target, scraper, under_way, baseline, established)
        wrk = " | ".join(line for line in load.lines if "requests in" in line or "errors" in line)
        print(f"\n  wrk: {wrk}; RSS {baseline.rss:.1f} -> peak {peak[0]:.1f} MiB, fds {baseline.fds} -> {peak[2]}")
        scraped_nine_in_ten(scraper)
        assert_bounded(target, baseline, peak)


# wrk's Lua: every request a new wrong password for the known user (one wrong password
# repeated is answered from memory, costing no check), on a fresh connection.
GUESSES = r"""
local alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
local function base64(data)
    return ((data:gsub(".", function(x)
        local bits, byte = "", x:byte()
        for i = 8, 1, -1 do bits = bits .. (byte % 2 ^ i - byte % 2 ^ (i - 1) > 0 and "1" or "0") end
        return bits
    end) .. "0000"):gsub("%d%d%d?%d?%d?%d?", function(x)
        if #x < 6 then return "" end
        local c = 0
        for i = 1, 6 do c = c + (x:sub(i, i) == "1" and 2 ^ (6 - i) or 0) end
        return alphabet:sub(c + 1, c + 1)
    end) .. ({ "", "==", "=" })[#data % 3 + 1])
end
local threads = 0
function setup(thread)
    threads = threads + 1
    thread:set("id", threads)
end
local n = 0
function request()
    n = n + 1
    local credential = base64("prometheus:guess-" .. tostring(id) .. "-" .. n)
    return wrk.format("GET", "/metrics", { ["Authorization"] = "Basic " .. credential, ["Connection"] = "close" })
end
"""


def check_s(rounds: int) -> float:
    """What one bcrypt check of this cost takes here, now (the best of a few)."""
    hashed = bcrypt.hashpw(b"x", bcrypt.gensalt(rounds=rounds))
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        bcrypt.checkpw(b"y", hashed)
        best = min(best, time.perf_counter() - started)
    return best


def test_fresh_addresses_of_the_scrapers_network_flooding_passwords_hold_its_first_check_within_the_bound(
    tmp_path: Path,
) -> None:
    # wrk's connections from the 253 addresses 127.0.0.1-253 in turn, each request a new
    # wrong password for the known user; the scraper is 127.0.0.254, of the same /24, and
    # the agent has not checked its password yet (a restart, a rotation). Nothing tells its
    # first check from a fresh address's; each fresh address fails its one check, then is
    # held by its network's throttle, so the scraper's check comes within 253 + 4 checks
    # (docs/endpoint.md), and from then on its address has shown a valid credential: its
    # connections are admitted before the flood's. Before issue 45 the scraper got 11 of 31
    # (its connections, waiting for their check, shed as never having shown a credential),
    # and wrk none of its requests answered.
    rounds = 6
    # 253 + 4 checks, each at most six times what it takes this process now (the agent's
    # bcrypt thread shares its one CPU with the loop serving the flood: about half of it,
    # and a loaded machine's), and 10 s more for the flood's connections on a loaded machine.
    bound_s = 6 * (253 + LIMITS.password_checks) * check_s(rounds) + 10
    users = tmp_path / "users"
    users.write_text("prometheus:" + bcrypt.hashpw(b"scrape-secret", bcrypt.gensalt(rounds=rounds)).decode() + "\n")
    with agent(tmp_path, "--basic-auth-file", str(users), prefix=pinned()) as target:
        wait_serving(target.url, target.process)
        baseline = settle(target.pid)
        scraper = Scraper(target.url, auth="Basic " + base64.b64encode(SECRET).decode(), source="127.0.0.254")
        with flood(target.url + "/metrics", 256, script=GUESSES, sources=("127.0.0.1", 253)) as load:
            wait_until(lambda: fds(target.pid) >= baseline.fds + LIMITS.connections, what="the flood under way")
            established = threading.Event()
            first: list[float] = []

            def under_way() -> None:
                established.set()
                started = time.monotonic()
                wait_until(
                    lambda: any(scraper.outcomes), what=f"the scraper's first check ({bound_s:.1f} s)", timeout=bound_s
                )
                first.append(time.monotonic() - started)
                attempts = len(scraper.outcomes)
                wait_until(
                    lambda: len(scraper.outcomes) >= attempts + FAIR_SCRAPES, what="the scrapes after", timeout=90
                )

            peak = attack_while_scraped(target, scraper, under_way, baseline, established)
        wrk = " | ".join(line for line in load.lines if "requests in" in line or "errors" in line)
        first_s = first[0] if first else float("nan")
        outcomes = "".join("+" if ok else "-" for ok in scraper.outcomes)
        print(f"\n  wrk: {wrk}; first check {first_s:.2f} s (bound {bound_s:.1f} s); scrapes {outcomes}")
        assert first, "the scraper's first check"
        answered = scraper.outcomes[-FAIR_SCRAPES:]
        assert answered.count(False) <= 1, (outcomes, scraper.failures[-FAIR_SCRAPES:])
        assert_bounded(target, baseline, peak)
