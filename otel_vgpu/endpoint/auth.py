"""Basic authentication for /metrics, from a file of users and password hashes.

One `user:hash` per line; `#` comments and blank lines are allowed. A hash is
bcrypt (`$2a$`, `$2b$`, `$2y$` with a cost of 4 to 31, as `htpasswd -B` and
Prometheus' web config write them) or `sha256:<64 hex>` (the SHA-256 of the
password). Every hash is checked whole when the file is loaded.

A check costs what bcrypt costs, on purpose, so it is made cheap to repeat
and never an oracle:

- a credential that passed is remembered (by a SHA-256 of it), so a scraper
  presenting it every 15 s costs one bcrypt check, not one per scrape;
- a credential that failed is remembered too, so repeating it costs nothing;
- an unknown user costs a bcrypt check of the same cost as the known ones,
  so timing does not tell which users exist;
- a peer that keeps failing is refused for a while (429), doubling up to a
  minute, before any bcrypt check, and so is a network (/24, /64) whose
  addresses keep failing together;
- every user's hash is of one kind and cost (a file that mixes them is
  refused), so the decoy an unknown user is checked against costs the same;
- a password bcrypt cannot take (over 72 bytes) is wrong, never an error.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import hmac
import ipaddress
import logging
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from otel_vgpu.files import FileProblem, read_regular

log = logging.getLogger(__name__)

_BCRYPT = re.compile(r"^\$2[aby]\$(?P<cost>\d{2})\$[./A-Za-z0-9]{53}$")
_SHA256 = re.compile(r"^sha256:(?P<hex>[0-9a-fA-F]{64})$")
_VALID = "expected user:hash, the hash bcrypt ($2b$<cost 04-31>$...) or sha256:<64 hex digits>"
# What the file itself should be, where it is missing or no regular file.
_FILE_VALID = "give a file of user:hash lines, the hash bcrypt ($2b$<cost 04-31>$...) or sha256:<64 hex digits>"
BCRYPT_MAX_PASSWORD_BYTES = 72
# A users file of thousands of bcrypt lines is under 1 MiB; past that it is not one.
MAX_USERS_FILE_BYTES = 1024 * 1024
# A bcrypt check slower than this at start is worth a warning: each failed
# login costs that much CPU until the peer is throttled.
SLOW_CHECK_S = 0.1
# Remembered credentials (passed and failed) and peers with failures: bounded.
CACHE_ENTRIES = 4096
FAILURES_BEFORE_THROTTLE = 5
NETWORK_FAILURES_BEFORE_THROTTLE = 20
THROTTLE_FIRST_S = 1.0
THROTTLE_MOST_S = 60.0


class AuthFileError(ValueError):
    """A credentials file that cannot be used. The message is one line."""


def parse_users(text: str, source: str) -> dict[str, str]:
    users: dict[str, str] = {}
    kinds: dict[str, tuple[str, int]] = {}  # each kind of hash: its first user and line
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        user, sep, hashed = line.partition(":")
        if not sep or not user or not hashed:
            raise AuthFileError(f"{source}:{number}: no user:hash pair; {_VALID}")
        bcrypt_hash = _BCRYPT.match(hashed)
        if not (bcrypt_hash or _SHA256.match(hashed)):
            raise AuthFileError(f"{source}:{number}: the hash of {user!r} is neither bcrypt nor sha256; {_VALID}")
        if bcrypt_hash and not 4 <= int(bcrypt_hash.group("cost")) <= 31:
            cost = bcrypt_hash.group("cost")
            raise AuthFileError(f"{source}:{number}: the bcrypt cost of {user!r} is {cost}, bcrypt takes 04 to 31")
        if user in users:
            raise AuthFileError(f"{source}:{number}: user {user!r} appears twice")
        users[user] = hashed
        kinds.setdefault(_cost(hashed), (user, number))
    if not users:
        raise AuthFileError(f"{source}: no users; {_VALID}")
    if len(kinds) > 1:
        # An unknown user is checked against a decoy of one cost: with users of
        # several costs, how fast a login is refused would tell which users exist.
        (first, (user_a, _)), (second, (user_b, line_b)) = list(kinds.items())[:2]
        raise AuthFileError(
            f"{source}:{line_b}: user {user_b!r} has a {second} hash and {user_a!r} a {first} one; give every "
            "user the same kind of hash and bcrypt cost (htpasswd -nbB -C <cost>), so that how fast a login is "
            "refused does not tell which users exist"
        )
    return users


def _cost(hashed: str) -> str:
    """A hash's kind and cost, in words: `bcrypt cost 10`, `sha256`."""
    match = _BCRYPT.match(hashed)
    return f"bcrypt cost {int(match.group('cost'))}" if match else "sha256"


def load_users(path: Path, name: str | None = None) -> dict[str, str]:
    """The users of the file at `path`; AuthFileError if it cannot be used. `name`: how the
    messages name the file (at start, the flag and its value); its path where None."""
    named = name or str(path)
    try:
        text = read_regular(path, MAX_USERS_FILE_BYTES).decode("utf-8")
    except FileProblem as problem:
        raise AuthFileError(f"{named}: {problem.what}; {_FILE_VALID}") from None
    except UnicodeDecodeError as error:
        raise AuthFileError(f"{named}: not UTF-8 text ({error.reason} at byte {error.start}); {_FILE_VALID}") from None
    users = parse_users(text, named)
    for user, hashed in users.items():
        # The hash must be one bcrypt can use: checked once, now, not on every request.
        try:
            started = time.monotonic()
            _verify("", hashed)
        except ValueError as error:
            raise AuthFileError(f"{named}: the hash of {user!r} cannot be used ({error}); {_VALID}") from None
        took = time.monotonic() - started
        if took > SLOW_CHECK_S:
            log.warning(
                "%s: checking %r's password takes %.0f ms of CPU; each failed login costs that until its peer "
                "is throttled (a lower bcrypt cost makes it cheaper)",
                path,
                user,
                took * 1000,
            )
    return users


class Verdict(str, Enum):
    ALLOW = "allow"
    DENY = "deny"
    THROTTLED = "throttled"


@dataclass(frozen=True, slots=True)
class Attempt:
    """A credential that needs a slow check (`BasicAuth.verify`)."""

    key: bytes
    password: str
    hashed: str
    known: bool
    peer: str


class BasicAuth:
    def __init__(self, users: dict[str, str], clock: Callable[[], float] = time.monotonic) -> None:
        self._users = users
        self._clock = clock
        self._lock = threading.Lock()
        self._passed: OrderedDict[bytes, None] = OrderedDict()
        self._failed: OrderedDict[bytes, None] = OrderedDict()
        self._peers: OrderedDict[str, tuple[int, float]] = OrderedDict()  # failures, refused until
        self._decoy = self._make_decoy(users)

    @staticmethod
    def _make_decoy(users: dict[str, str]) -> str:
        """A hash as costly as the costliest user's, for unknown users."""
        costs = [int(m.group("cost")) for h in users.values() if (m := _BCRYPT.match(h))]
        if not costs:
            return "sha256:" + "0" * 64
        import bcrypt  # noqa: PLC0415 - only with bcrypt users

        return str(bcrypt.hashpw(b"otel-vgpu decoy", bcrypt.gensalt(rounds=max(costs))).decode())

    def remembered(self, header: str | None) -> bool:
        """Whether the header's credential is one that passed a check before: no check is made,
        and nothing is counted."""
        credential = _credential(header)
        if credential is None:
            return False
        with self._lock:
            return self._key(*credential) in self._passed

    def _key(self, user: str, password: str) -> bytes:
        return hashlib.sha256(f"{user}\0{password}\0{self._users.get(user)}".encode()).digest()

    def decide(self, header: str | None, peer: str) -> Verdict | Attempt:
        """The verdict where it is cheap to reach, else the attempt to verify."""
        credential = _credential(header)
        if credential is None:
            return Verdict.DENY
        user, password = credential
        hashed = self._users.get(user)
        key = self._key(user, password)
        with self._lock:
            if key in self._passed:
                self._passed.move_to_end(key)
                return Verdict.ALLOW
            if key in self._failed:
                # Known to be wrong, so it costs no check: it counts against the peer that
                # repeats it and no one else. Its network is throttled only by checks spent
                # on new wrong passwords, which are what cost the bcrypt thread.
                self._note_failure(peer, network=False)
                return Verdict.DENY
            if self._throttled(peer):
                return Verdict.THROTTLED
        return Attempt(key, password, hashed or self._decoy, hashed is not None, peer)

    def _throttled(self, peer: str) -> bool:
        """The peer is refused for now: its own failures throttle it, and its network's
        (/24, /64) throttle it once it has failed itself. A peer with no failure of its
        own gets its check whatever its neighbours sent (a scraper whose password is not
        remembered yet, after a restart), and one failure puts it under its network's
        throttle: a source costs the bcrypt thread one check while its network is
        throttled. The caller holds the lock."""
        now = self._clock()
        failures, until = self._peers.get(peer, (0, 0.0))
        if now < until:
            return True
        return failures > 0 and now < self._peers.get(network_of(peer), (0, 0.0))[1]

    def verify(self, attempt: Attempt) -> Verdict:
        """The slow part: bcrypt (or SHA-256), then remembered either way."""
        try:
            ok = attempt.known and _verify(attempt.password, attempt.hashed)
            if not attempt.known:
                _verify(attempt.password, attempt.hashed)  # the same cost as a known user's
        except ValueError as error:  # a hash checked at load cannot fail; a password can be unusable
            log.debug("password check refused: %s", error)
            ok = False
        with self._lock:
            if ok:
                _remember(self._passed, attempt.key)
                self._peers.pop(attempt.peer, None)
                return Verdict.ALLOW
            _remember(self._failed, attempt.key)
            self._note_failure(attempt.peer)
        return Verdict.DENY

    def retry_after(self, peer: str) -> int:
        with self._lock:
            until = max(self._peers.get(who, (0, 0.0))[1] for who in (peer, network_of(peer)))
        return max(1, int(until - self._clock() + 0.999))

    def _note_failure(self, peer: str, network: bool = True) -> None:
        """One more failure for `peer` and, with `network`, for its network; the caller
        holds the lock. A network is throttled after NETWORK_FAILURES_BEFORE_THROTTLE:
        many addresses of one /24 or /64 are one attacker as far as a bcrypt thread is
        concerned."""
        counted = [(peer, FAILURES_BEFORE_THROTTLE)]
        if network:
            counted.append((network_of(peer), NETWORK_FAILURES_BEFORE_THROTTLE))
        for who, allowed in counted:
            failures, until = self._peers.pop(who, (0, 0.0))
            failures += 1
            if failures >= allowed:
                # Doubling from the first wait up to the most; the exponent is bounded so that
                # thousands of failures (a peer repeating one wrong password) never overflow it.
                wait = min(THROTTLE_MOST_S, THROTTLE_FIRST_S * 2 ** min(failures - allowed, 32))
                until = self._clock() + wait
            self._peers[who] = (failures, until)
        while len(self._peers) > CACHE_ENTRIES:
            self._peers.popitem(last=False)


@functools.lru_cache(maxsize=CACHE_ENTRIES)
def network_of(peer: str) -> str:
    """The /24 of an IPv4 address, the /64 of an IPv6 one; the peer itself if it is neither.
    Remembered: the fair shares ask it of every connection at every admission (a few
    microseconds of parsing each), and a flood's admissions come by the thousand a second."""
    try:
        address = ipaddress.ip_address(peer)
    except ValueError:
        return peer
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    prefix = 24 if address.version == 4 else 64
    return str(ipaddress.ip_network(f"{address}/{prefix}", strict=False))


def _credential(header: str | None) -> tuple[str, str] | None:
    """(user, password) of a Basic Authorization header; the scheme is case-insensitive (RFC 7617)."""
    if not header:
        return None
    scheme, _, value = header.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        # A str with non-ASCII characters is a ValueError to b64decode, not a binascii.Error.
        decoded = base64.b64decode(value.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None
    user, sep, password = decoded.partition(":")
    return (user, password) if sep else None


def _remember(cache: OrderedDict[bytes, None], key: bytes) -> None:
    cache[key] = None
    cache.move_to_end(key)
    while len(cache) > CACHE_ENTRIES:
        cache.popitem(last=False)


def _verify(password: str, hashed: str) -> bool:
    """Whether `password` matches; ValueError for a hash bcrypt cannot use."""
    sha = _SHA256.match(hashed)
    if sha is not None:
        digest = hashlib.sha256(password.encode()).hexdigest()
        return hmac.compare_digest(digest, sha.group("hex").lower())
    import bcrypt  # noqa: PLC0415 - only with bcrypt users

    encoded = password.encode()
    if len(encoded) > BCRYPT_MAX_PASSWORD_BYTES:
        # bcrypt reads 72 bytes at most (the library refuses more): no such
        # password can be the one the hash was made from.
        bcrypt.checkpw(b"", hashed.encode())  # the same cost as any other check
        return False
    return bool(bcrypt.checkpw(encoded, hashed.encode()))
