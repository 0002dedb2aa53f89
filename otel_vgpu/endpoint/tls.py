"""The endpoint's TLS: the server context from the certificate, key and client CA files,
and, when they cannot be used, one line that says which file is wrong and what it should hold."""

from __future__ import annotations

import contextlib
import os
import re
import ssl
from collections.abc import Iterator
from pathlib import Path

from otel_vgpu.config import Config, flag_or_variable
from otel_vgpu.files import MAX_PEM_BYTES, FileProblem, read_regular

# What each file should hold, said where it cannot be used; by Config field.
_HOLDS = {
    "tls_cert_file": "a PEM certificate (BEGIN CERTIFICATE)",
    "tls_key_file": "a PEM private key (BEGIN PRIVATE KEY)",
    "tls_client_ca_file": "the clients' CA certificate (BEGIN CERTIFICATE)",
}


def server_context(config: Config) -> ssl.SSLContext | None:
    """The endpoint's TLS context from the configured files; None where none are given.
    ValueError, with one line that names the flag (or variable), the file and what it should
    hold, where they cannot be used."""
    cert, key, ca = config.tls_cert_file, config.tls_key_file, config.tls_client_ca_file
    if (cert is None) != (key is None):
        given, missing = ("tls_cert_file", "tls_key_file") if key is None else ("tls_key_file", "tls_cert_file")
        raise ValueError(
            f"{config.spelled(given)} without {flag_or_variable(missing)}: give both, "
            f"{_HOLDS['tls_cert_file']} and {_HOLDS['tls_key_file']}"
        )
    if ca is not None and cert is None:
        raise ValueError(
            f"{config.spelled('tls_client_ca_file')} asks for client certificates over TLS, which needs "
            f"{flag_or_variable('tls_cert_file')} and {flag_or_variable('tls_key_file')}: give those too"
        )
    if cert is None or key is None:
        return None
    try:
        return tls_context(cert, key, ca)
    except (FileProblem, OSError, ssl.SSLError) as error:
        raise ValueError(tls_problem(config, error)) from None


def tls_context(cert_file: Path, key_file: Path, client_ca_file: Path | None) -> ssl.SSLContext:
    """A server context. With a client CA, a client certificate is asked for
    and, if sent, must be signed by it; /metrics then requires one. The files
    are read as every file the agent is given is (otel_vgpu/files.py), and
    OpenSSL is handed their bytes, never the paths: it would open a FIFO and
    wait. FileProblem names a file that cannot be read; ssl.SSLError, one
    that does not hold what it should."""
    cert = read_regular(cert_file, MAX_PEM_BYTES)
    key = read_regular(key_file, MAX_PEM_BYTES)
    client_ca = read_regular(client_ca_file, MAX_PEM_BYTES) if client_ca_file is not None else None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    with _in_memory(cert) as cert_path, _in_memory(key) as key_path:
        context.load_cert_chain(cert_path, key_path)
    if client_ca is not None:
        context.load_verify_locations(cadata=client_ca.decode("latin-1"))
        context.verify_mode = ssl.CERT_OPTIONAL
    return context


@contextlib.contextmanager
def _in_memory(data: bytes) -> Iterator[str]:
    """A path to `data` for OpenSSL's file loaders: an anonymous memory file (the
    key is never written to a disk, and the root may be read-only)."""
    descriptor = os.memfd_create("otel-vgpu-tls", os.MFD_CLOEXEC)
    try:
        os.write(descriptor, data)
        yield f"/proc/self/fd/{descriptor}"
    finally:
        os.close(descriptor)


def _pem_kinds(path: Path) -> set[str]:
    """The kinds of PEM block in a file (`CERTIFICATE`, `PRIVATE KEY`, ...); empty if unreadable."""
    try:
        text = read_regular(path, MAX_PEM_BYTES).decode("latin-1")
    except FileProblem:
        return set()
    return set(re.findall(r"-----BEGIN ([A-Z0-9 ]+)-----", text))


def tls_problem(config: Config, error: Exception) -> str:
    """One line saying which TLS file is wrong, by its flag or variable, and what it should hold."""
    cert, key, ca = config.tls_cert_file, config.tls_key_file, config.tls_client_ca_file
    assert cert is not None and key is not None
    spelled = {field: config.spelled(field) for field in _HOLDS if getattr(config, field) is not None}
    if isinstance(error, FileProblem):
        # The first field naming the file: the certificate and the key may be one file.
        field = next((f for f in _HOLDS if getattr(config, f) == error.path), None)
        if field is None:
            return f"cannot read the TLS file {error.path}: {error.what}"
        return f"{spelled[field]}: {error.what}; give {_HOLDS[field]}"
    if isinstance(error, OSError) and not isinstance(error, ssl.SSLError):
        return f"cannot use {' and '.join(spelled.values())}: {error.strerror or error}"
    found = {path: _pem_kinds(path) for path in (cert, key, *([ca] if ca else []))}
    is_key = {kind for kind in found[cert] | found[key] if kind.endswith("PRIVATE KEY")}

    def holds(path: Path) -> str:
        return ", ".join(sorted(found[path])) or "no PEM block"

    if "CERTIFICATE" not in found[cert] and "CERTIFICATE" in found[key] and found[cert] & is_key:
        return (
            f"the TLS certificate and key are swapped: {spelled['tls_cert_file']} holds a private key and "
            f"{spelled['tls_key_file']} a certificate; give the certificate (BEGIN CERTIFICATE) to "
            f"{config.origin('tls_cert_file')} and the key (BEGIN PRIVATE KEY) to {config.origin('tls_key_file')}"
        )
    if "CERTIFICATE" not in found[cert]:
        return f"{spelled['tls_cert_file']} holds {holds(cert)}; expected {_HOLDS['tls_cert_file']}"
    if not found[key] & is_key:
        return f"{spelled['tls_key_file']} holds {holds(key)}; expected {_HOLDS['tls_key_file']}"
    if ca is not None and "CERTIFICATE" not in found[ca]:
        return f"{spelled['tls_client_ca_file']} holds {holds(ca)}; expected {_HOLDS['tls_client_ca_file']}"
    reason = getattr(error, "reason", None) or str(error)
    if reason == "KEY_VALUES_MISMATCH":
        return (
            f"{spelled['tls_key_file']} is not the key of the certificate in {spelled['tls_cert_file']}; "
            "give the private key the certificate was issued for"
        )
    return f"cannot use {' and '.join(spelled.values())}: {error}"
