"""The admission rule (endpoint/admission.py), the shares and queues it and the server use
(endpoint/fair_shares.py, endpoint/queues.py) and the password checks' queue (endpoint/checks.py), as
rules over plain data: who goes when the cap is full, who waits, whose check runs next."""

from __future__ import annotations

import asyncio
import functools
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest

from otel_vgpu.endpoint.admission import victim
from otel_vgpu.endpoint.auth import network_of
from otel_vgpu.endpoint.checks import NETWORK_HALF_LIFE_S, CheckQueue, decayed
from otel_vgpu.endpoint.fair_shares import Holder, over_share
from otel_vgpu.endpoint.queues import FairQueue
from otel_vgpu.limits import Limits

pytestmark = pytest.mark.unit

LIMITS = Limits()
NOW = 100.0


@dataclass(eq=False)
class Conn:
    """A connection as the rule sees it: by default busy with a request (never idle, never
    stalled), opened long ago, no credential shown."""

    source: str
    waiting: bool = False
    waiting_since: float = 0.0
    opened: float = 0.0
    answered: int = 1
    handshaking: bool = False
    partial: bool = False
    presenting: bool = False
    writing_since: float | None = None
    credentialed: bool = False
    unread: bool = False

    def quiet(self) -> bool:
        return not self.unread

    def stalled(self, now: float, after_s: float) -> bool:
        return self.writing_since is not None and now - self.writing_since >= after_s


def held(*counts: tuple[str, int]) -> list[Conn]:
    return [Conn(source) for source, count in counts for _ in range(count)]


def test_a_newcomer_is_served_while_anyone_holds_more_than_it() -> None:
    # Four addresses of four /24s holding 16 places each: none over a quarter of the cap.
    connections = held(("10.0.1.1", 16), ("10.0.2.1", 16), ("10.0.3.1", 16), ("10.0.4.1", 16))
    shed = victim(connections, "10.0.9.9", NOW, LIMITS, False, network_of)
    assert shed is not None and shed.source in {"10.0.1.1", "10.0.2.1", "10.0.3.1", "10.0.4.1"}
    # One of the four asking for a 17th place is not served: nobody holds more than it would.
    assert victim(connections, "10.0.1.1", NOW, LIMITS, False, network_of) is None


def test_networks_are_shared_before_addresses() -> None:
    # One /24 of 32 addresses holding two places each: each address holds little, the network all.
    connections = held(*((f"10.0.1.{n}", 2) for n in range(32)))
    shed = victim(connections, "10.0.9.9", NOW, LIMITS, False, network_of)
    assert shed is not None and network_of(shed.source) == "10.0.1.0/24"
    # A newcomer of that /24 is only served by an address of it holding more than it would.
    assert victim(connections, "10.0.1.200", NOW, LIMITS, False, network_of) is not None
    assert victim(held(*((f"10.0.1.{n}", 1) for n in range(64))), "10.0.1.200", NOW, LIMITS, False, network_of) is None


def test_a_connection_waiting_between_requests_goes_before_one_mid_request() -> None:
    busy, between = Conn("10.0.1.1"), Conn("10.0.1.1", waiting=True, waiting_since=NOW - 0.1)
    connections = [busy, between, *held(("10.0.1.1", 6))]
    assert victim(connections, "10.0.9.9", NOW, LIMITS, False, network_of) is between


def test_without_credentials_many_addresses_of_one_place_each_hold_the_cap() -> None:
    # 64 addresses in 64 /24s, one place each: past what sharing can do (a NetworkPolicy's job).
    connections = held(*((f"10.0.{n}.1", 1) for n in range(64)))
    assert victim(connections, "10.0.99.9", NOW, LIMITS, False, network_of) is None


def test_with_credentials_required_those_that_never_showed_one_go_first() -> None:
    scraper = Conn("10.0.99.9", credentialed=True)
    connections = [scraper, *held(*((f"10.0.{n}.1", 1) for n in range(63)))]
    shed = victim(connections, "10.0.98.1", NOW, LIMITS, True, network_of)
    assert shed is not None and shed is not scraper and not shed.credentialed
    # The scraper's own place is never taken for one that showed nothing, however many ask.
    alone = [scraper, *(Conn(f"10.0.{n}.1", credentialed=True) for n in range(63))]
    assert victim(alone, "10.0.98.1", NOW, LIMITS, True, network_of) is None


def test_a_lone_connection_just_opened_or_in_its_handshake_is_not_taken() -> None:
    # A scraper's connection that has not sent its request yet, and a handshake, each its
    # address's one place, stay.
    young = Conn("10.0.1.1", opened=NOW - 0.01)
    shaking = Conn("10.0.3.1", handshaking=True)
    for credentials in (False, True):
        connections = [young, shaking, *held(("10.0.2.1", 3))]
        assert victim(connections, "10.0.9.9", NOW, LIMITS, credentials, network_of) not in (young, shaking)


@pytest.mark.parametrize("credentials", [False, True], ids=["open", "credentials"])
def test_young_connections_and_handshakes_of_one_over_its_share_are_taken(credentials: bool) -> None:
    # A client opening a fresh connection per request holds only young ones, some in their
    # handshake: over its share, they go for a newcomer, one that has sent its request last.
    busy = [Conn("10.0.1.1", opened=NOW - 0.01, waiting_since=NOW - 0.01, answered=0) for _ in range(40)]
    shaking = [Conn("10.0.1.1", waiting=True, opened=NOW - 0.2, waiting_since=NOW - 0.2, handshaking=True)]
    connections = [*busy, *shaking, *(Conn(f"10.0.{n}.1", opened=NOW - 0.01) for n in range(2, 25))]
    assert victim(connections, "10.0.99.9", NOW, LIMITS, credentials, network_of) is shaking[0]
    assert victim(busy, "10.0.99.9", NOW, LIMITS, credentials, network_of) in busy


def test_a_request_unread_behind_a_busy_loop_is_no_trickler() -> None:
    # Its bytes wait in the kernel while the loop serves a flood: it has not trickled.
    unread = Conn("10.0.99.9", waiting=True, waiting_since=NOW - 5, opened=NOW - 5, answered=0, unread=True)
    trickler = Conn("10.0.1.1", waiting=True, waiting_since=NOW - 5, opened=NOW - 5, answered=0, unread=True)
    trickler.partial = True
    assert victim([unread, trickler], "10.0.2.1", NOW, LIMITS, False, network_of) is trickler
    assert victim([unread], "10.0.2.1", NOW, LIMITS, False, network_of) is None


def test_an_addresss_only_new_silent_connection_is_shed_later_than_an_idle_kept_alive_one() -> None:
    # A loaded client may take a few hundred milliseconds from its connect to its send; a
    # flood of silent connections from one address goes as before.
    age = (LIMITS.quiet_after_s + LIMITS.shed_after_s) / 2
    new = Conn("10.0.99.9", waiting=True, waiting_since=NOW - age, opened=NOW - age, answered=0)
    idle = Conn("10.0.1.1", waiting=True, waiting_since=NOW - age, opened=NOW - 60, answered=3)
    assert victim([new, idle], "10.0.2.1", NOW, LIMITS, False, network_of) is idle
    assert victim([new], "10.0.2.1", NOW, LIMITS, False, network_of) is None
    silent = [Conn("10.0.1.1", waiting=True, waiting_since=NOW - age, opened=NOW - age, answered=0) for _ in range(2)]
    assert victim(silent, "10.0.1.1", NOW, LIMITS, False, network_of) in silent


def test_behind_one_proxy_a_newcomer_takes_its_own_oldest_idle_place() -> None:
    oldest = Conn("10.0.1.1", waiting=True, waiting_since=NOW - 0.2)
    connections = [oldest, *(Conn("10.0.1.1", waiting=True, waiting_since=NOW - 0.1) for _ in range(63))]
    assert victim(connections, "10.0.1.1", NOW, LIMITS, False, network_of) is oldest


class Gate:
    """A check that waits until released, and says who it was for."""

    def __init__(self, name: str, log: list[str]) -> None:
        self.name, self.log, self.open = name, log, threading.Event()

    def __call__(self) -> str:
        self.open.wait(5)
        self.log.append(self.name)
        return self.name


def test_the_next_check_is_of_the_address_then_network_that_had_the_fewest() -> None:
    async def scenario() -> tuple[list[str], list[str | None]]:
        log: list[str] = []
        with ThreadPoolExecutor(max_workers=1) as executor:
            queue = CheckQueue(executor, 4, network_of)
            gates = [Gate(name, log) for name in ("a1", "a2", "a3", "a4", "scraper")]
            # An attacker of 10.0.1.0/24 has had its checks; one runs and three wait, the queue full.
            first = asyncio.ensure_future(queue.run(gates[0], "10.0.1.1"))
            await asyncio.sleep(0.01)
            waiting = [asyncio.ensure_future(queue.run(g, f"10.0.1.{k + 2}")) for k, g in enumerate(gates[1:4])]
            await asyncio.sleep(0.01)
            # The scraper, of another network and never checked, takes the last one's place.
            scraper = asyncio.ensure_future(queue.run(gates[4], "10.0.2.1"))
            await asyncio.sleep(0.01)
            for gate in gates:
                gate.open.set()
            results = await asyncio.gather(first, *waiting, scraper)
        return log, list(results)

    log, results = asyncio.run(scenario())
    assert log[:2] == ["a1", "scraper"]  # the scraper's check is the next to run
    assert results.count(None) == 1 and results[-1] == "scraper"  # one attacker lost its place


def test_a_full_queue_of_fewer_checked_clients_refuses_a_newcomer() -> None:
    async def scenario() -> str | None:
        with ThreadPoolExecutor(max_workers=1) as executor:
            queue = CheckQueue(executor, 1, network_of)
            gate = Gate("first", [])
            first = asyncio.ensure_future(queue.run(gate, "10.0.1.1"))
            await asyncio.sleep(0.01)
            refused = await queue.run(lambda: "second", "10.0.2.1")  # only the running check: no place
            gate.open.set()
            await first
        return refused

    assert asyncio.run(scenario()) is None


@pytest.mark.parametrize("peer", ["10.0.3.4", "2001:db8::1", "::ffff:10.0.3.4"])
def test_networks_are_24s_and_64s(peer: str) -> None:
    assert network_of(peer) in {"10.0.3.0/24", "2001:db8::/64"}


def test_a_holder_gives_way_only_while_it_holds_more_than_the_newcomer_would() -> None:
    assert over_share(["10.0.1.1"] * 3, "10.0.2.1", network_of) == Holder("10.0.1.0/24")
    assert over_share(["10.0.1.1"], "10.0.2.1", network_of) is None
    # Within one network, the address holding the most.
    assert over_share(["10.0.1.1"] * 3 + ["10.0.1.2"], "10.0.1.3", network_of) == Holder("10.0.1.0/24", "10.0.1.1")
    assert over_share(["10.0.1.1"] * 3, "10.0.1.1", network_of) is None


def test_a_full_queue_refuses_the_newest_waiter_of_whoever_waits_most() -> None:
    async def scenario() -> None:
        queue = FairQueue(4, network_of)
        flood = [queue.join("10.0.1.1") for _ in range(3)]
        other = queue.join("10.0.2.1")
        assert None not in flood and other is not None
        scraper = queue.join("10.0.99.9")
        assert scraper is not None and len(queue) == 4
        newest = flood[-1]
        assert newest is not None and newest.turn.done() and newest.turn.result() is False
        # The flood's own newcomer waits no more than it already does: refused.
        assert queue.join("10.0.1.1") is None
        # Served first: whoever holds least under the cap (the scraper and 10.0.2.1 hold none).
        ranked = queue.ranked(["10.0.1.1"] * 60 + ["10.0.2.1"])
        assert ranked[0] is scraper and ranked[1] is other

    asyncio.run(scenario())


def test_a_networks_checks_count_half_as_much_a_half_life_later() -> None:
    assert decayed(8, 0.0, 0.0) == 8
    assert decayed(8, 0.0, NETWORK_HALF_LIFE_S) == pytest.approx(4)
    assert decayed(8, 10.0, 0.0) == 8  # a clock that went back counts nothing off


def checked_in_turn(asks: list[tuple[str, str]], limit: int = 8) -> list[str]:
    """Each (name, peer) asks for a check in turn, the first held running until all have
    asked; a name starting "ok" passes. The order they ran in."""

    async def scenario() -> list[str]:
        ran: list[str] = []
        with ThreadPoolExecutor(max_workers=1) as executor:
            queue = CheckQueue(executor, limit, network_of, passed=lambda result: str(result).startswith("ok"))
            gate = threading.Event()

            def check(name: str) -> str:
                gate.wait(5)
                ran.append(name)
                return name

            tasks = []
            for name, peer in asks:
                tasks.append(asyncio.ensure_future(queue.run(functools.partial(check, name), peer)))
                await asyncio.sleep(0.01)
            gate.set()
            await asyncio.gather(*tasks)
        return ran

    return asyncio.run(scenario())


def test_an_address_that_failed_goes_after_one_that_never_did_of_its_own_network() -> None:
    # The attacker's addresses of the scraper's /24, each failed once, ask again: the
    # scraper, whose password is not remembered yet, has failed nothing.
    failed = checked_in_turn([(f"bad-{n}", f"10.0.1.{n}") for n in range(1, 5)])
    assert failed == ["bad-1", "bad-2", "bad-3", "bad-4"]

    async def scenario() -> list[str]:
        ran: list[str] = []
        with ThreadPoolExecutor(max_workers=1) as executor:
            queue = CheckQueue(executor, 8, network_of, passed=lambda result: str(result).startswith("ok"))
            for n in range(1, 5):  # each address fails once
                await queue.run(functools.partial(ran.append, f"first-{n}"), f"10.0.1.{n}")
            gate = threading.Event()

            def check(name: str) -> str:
                gate.wait(5)
                ran.append(name)
                return name

            tasks = [asyncio.ensure_future(queue.run(functools.partial(check, "held"), "10.0.9.9"))]
            await asyncio.sleep(0.01)
            for n in range(1, 5):
                tasks.append(asyncio.ensure_future(queue.run(functools.partial(check, f"again-{n}"), f"10.0.1.{n}")))
            tasks.append(asyncio.ensure_future(queue.run(functools.partial(check, "ok-scraper"), "10.0.1.200")))
            await asyncio.sleep(0.01)
            gate.set()
            await asyncio.gather(*tasks)
        return ran

    ran = asyncio.run(scenario())
    assert ran[ran.index("held") + 1] == "ok-scraper", ran


def test_fresh_addresses_of_a_busy_network_go_after_an_address_of_a_quiet_one() -> None:
    # The scraper's address was checked before (and passed: a rotation since); fresh addresses
    # of a /24 that has had many checks lately ask first.
    asks = [(f"bad-{n}", f"10.0.1.{n}") for n in range(1, 6)]
    asks += [("ok-scraper", "10.0.2.1")]
    ran = checked_in_turn(asks)
    assert ran[:2] == ["bad-1", "ok-scraper"], ran


def test_an_address_refused_a_check_keeps_its_claim_before_fresh_ones_that_came_after() -> None:
    async def scenario() -> tuple[list[str | None], list[str]]:
        ran: list[str] = []
        gates = {name: threading.Event() for name in ("a1", "a2", "a3", "scraper")}
        with ThreadPoolExecutor(max_workers=1) as executor:
            queue = CheckQueue(executor, 2, network_of)  # one running, one waiting

            def check(name: str) -> str:
                gates[name].wait(5)
                ran.append(name)
                return name

            def ask(name: str, peer: str) -> asyncio.Future[str | None]:
                return asyncio.ensure_future(queue.run(functools.partial(check, name), peer))

            first, second = ask("a1", "10.0.1.1"), ask("a2", "10.0.1.2")
            await asyncio.sleep(0.01)
            refused = [await queue.run(functools.partial(check, "scraper"), "10.0.1.200")]  # full: its claim stays
            gates["a1"].set()
            await first  # a2 runs; the waiting place is free
            late = ask("a3", "10.0.1.3")  # a fresh address, after the scraper's claim, takes it
            await asyncio.sleep(0.01)
            again = ask("scraper", "10.0.1.200")  # its older claim takes a3's place
            await asyncio.sleep(0.01)
            for gate in gates.values():
                gate.set()
            refused += await asyncio.gather(second, late, again)
        return refused, ran

    results, ran = asyncio.run(scenario())
    assert results == [None, "a2", None, "scraper"] and ran == ["a1", "a2", "scraper"], (results, ran)


def test_a_request_presenting_a_credential_is_not_shed_as_one_that_never_showed_one() -> None:
    # The scraper's first request waits for its password's check; the flood's addresses of
    # its /24 hold one place each, all settled, none having shown a credential.
    scraper = Conn("10.0.1.200", presenting=True)
    flood = [Conn(f"10.0.1.{n}") for n in range(1, 64)]
    shed = victim([scraper, *flood], "10.0.1.100", NOW, LIMITS, True, network_of)
    assert shed is not None and shed is not scraper


def test_a_newcomer_of_an_address_that_showed_a_credential_is_served_as_if_it_held_nothing() -> None:
    # It holds one place already (a scrape in progress) and every other address one too.
    connections = [Conn("10.0.1.200", credentialed=True), *(Conn(f"10.0.1.{n}") for n in range(1, 64))]
    assert victim(connections, "10.0.1.200", NOW, LIMITS, True, network_of) is None
    shed = victim(connections, "10.0.1.200", NOW, LIMITS, True, network_of, shown=True)
    assert shed is not None and shed.source != "10.0.1.200"


def test_a_full_queue_makes_room_for_an_address_that_showed_a_credential() -> None:
    async def scenario() -> None:
        queue = FairQueue(3, network_of, favoured=lambda source: source == "10.0.1.200")
        flood = [queue.join(f"10.0.1.{n}") for n in range(1, 4)]
        assert queue.join("10.0.1.99") is None  # one waiter each: no newcomer is owed a place
        scraper = queue.join("10.0.1.200")
        assert scraper is not None and flood[-1] is not None and flood[-1].turn.result() is False
        assert queue.ranked(["10.0.1.1"])[0] is scraper

    asyncio.run(scenario())
