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
from dataclasses import dataclass
from pathlib import Path

import bcrypt
import pytest

from testkit.agent import wait_until
from testkit.certs import make_certs
from testkit.wrk import flood, pinned
from tests.test_hostile_clients import (
    FAIR_SCRAPES,
    LIMITS,
    Scraper,
    agent,
    assert_bounded,
    attack_while_scraped,
    fds,
    scraped_nine_in_ten,
    warm,
)

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
