"""Basic authentication for /metrics, from a file of users and password hashes.

One `user:hash` per line; `#` comments and blank lines are allowed. A hash is
bcrypt (`$2a$`, `$2b$`, `$2y$`, as `htpasswd -B` and Prometheus' web config
write them) or `sha256:<64 hex>` (the SHA-256 of the password). bcrypt is
slow on purpose; a successful check is remembered (by a SHA-256 of the
credentials), so a scraper presenting the same credentials every 15 s costs
one bcrypt check, not one per scrape.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import threading
from pathlib import Path

_BCRYPT = re.compile(r"^\$2[aby]\$\d{2}\$[./A-Za-z0-9]{53}$")
_SHA256 = re.compile(r"^sha256:(?P<hex>[0-9a-fA-F]{64})$")
_VALID = "expected user:hash, the hash bcrypt ($2b$...) or sha256:<64 hex digits>"


class AuthFileError(ValueError):
    """A credentials file that cannot be used. The message is one line."""


def parse_users(text: str, source: str) -> dict[str, str]:
    users: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        user, sep, hashed = line.partition(":")
        if not sep or not user or not hashed:
            raise AuthFileError(f"{source}:{number}: no user:hash pair; {_VALID}")
        if not (_BCRYPT.match(hashed) or _SHA256.match(hashed)):
            raise AuthFileError(f"{source}:{number}: the hash of {user!r} is neither bcrypt nor sha256; {_VALID}")
        if user in users:
            raise AuthFileError(f"{source}:{number}: user {user!r} appears twice")
        users[user] = hashed
    if not users:
        raise AuthFileError(f"{source}: no users; {_VALID}")
    return users


def load_users(path: Path) -> dict[str, str]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise AuthFileError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as error:
        raise AuthFileError(f"{path}: cannot be read ({error})") from None
    return parse_users(text, str(path))


class BasicAuth:
    def __init__(self, users: dict[str, str]) -> None:
        self._users = users
        self._verified: set[bytes] = set()
        self._lock = threading.Lock()

    def check(self, header: str | None) -> bool:
        """Whether an Authorization header carries a known user's password."""
        if not header or not header.startswith("Basic "):
            return False
        try:
            decoded = base64.b64decode(header[6:].strip(), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return False
        user, sep, password = decoded.partition(":")
        hashed = self._users.get(user)
        if not sep or hashed is None:
            return False
        key = hashlib.sha256(f"{user}\0{password}\0{hashed}".encode()).digest()
        with self._lock:
            if key in self._verified:
                return True
        if not _verify(password, hashed):
            return False
        with self._lock:
            self._verified.add(key)
        return True


def _verify(password: str, hashed: str) -> bool:
    sha = _SHA256.match(hashed)
    if sha is not None:
        digest = hashlib.sha256(password.encode()).hexdigest()
        return hmac.compare_digest(digest, sha.group("hex").lower())
    import bcrypt  # noqa: PLC0415 - only with bcrypt users

    return bool(bcrypt.checkpw(password.encode(), hashed.encode()))
