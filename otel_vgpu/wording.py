"""How counts and addresses are written in the agent's messages."""

from __future__ import annotations


def counted(number: int, noun: str, plural: str | None = None) -> str:
    """`1 GPU`, `2 GPUs`, `0 pods`."""
    return f"{number} {noun if number == 1 else plural or noun + 's'}"


def host_in_url(address: str) -> str:
    """An address as a URL's host: an IPv6 address in brackets (RFC 3986)."""
    return f"[{address}]" if ":" in address and not address.startswith("[") else address
