"""The endpoint's TLS: the server context from the certificate, key and client CA files,
and, when they cannot be used, one line that says which file is wrong and what it should hold."""

from __future__ import annotations

import contextlib
import os
import re
import ssl
from collections.abc import Iterator
from pathlib import Path

from otel_vgpu.config import Config
from otel_vgpu.files import MAX_PEM_BYTES, FileProblem, read_regular


def server_context(config: Config) -> ssl.SSLContext | None:
    """The endpoint's TLS context from the configured files; None where none are given.
    ValueError, with one line that names the flag, the file and what it should hold,
    where they cannot be used."""
    cert, key, ca = config.tls_cert_file, config.tls_key_file, config.tls_client_ca_file
    if (cert is None) != (key is None):
        raise ValueError("--tls-cert-file and --tls-key-file go together")
    if ca is not None and cert is None:
        raise ValueError("--tls-client-ca-file needs --tls-cert-file and --tls-key-file")
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
    """One line saying which TLS file is wrong and what it should hold."""
    cert, key, ca = config.tls_cert_file, config.tls_key_file, config.tls_client_ca_file
    assert cert is not None and key is not None
    if isinstance(error, FileProblem):
        flags = {cert: "--tls-cert-file", key: "--tls-key-file", ca: "--tls-client-ca-file"}
        return f"cannot read {flags.get(error.path, 'the TLS file')} {error.path}: {error.what}"
    if isinstance(error, OSError) and not isinstance(error, ssl.SSLError):
        return f"cannot use the TLS files ({cert}, {key}): {error.strerror or error}"
    found = {path: _pem_kinds(path) for path in (cert, key, *([ca] if ca else []))}
    is_key = {kind for kind in found[cert] | found[key] if kind.endswith("PRIVATE KEY")}

    def holds(path: Path) -> str:
        return ", ".join(sorted(found[path])) or "no PEM block"

    if "CERTIFICATE" not in found[cert] and "CERTIFICATE" in found[key] and found[cert] & is_key:
        return (
            f"the TLS certificate and key are swapped: --tls-cert-file {cert} holds a private key and "
            f"--tls-key-file {key} a certificate; give the certificate (BEGIN CERTIFICATE) to --tls-cert-file "
            "and the key (BEGIN PRIVATE KEY) to --tls-key-file"
        )
    if "CERTIFICATE" not in found[cert]:
        return f"--tls-cert-file {cert} holds {holds(cert)}; expected a PEM certificate (BEGIN CERTIFICATE)"
    if not found[key] & is_key:
        return f"--tls-key-file {key} holds {holds(key)}; expected a PEM private key (BEGIN PRIVATE KEY)"
    if ca is not None and "CERTIFICATE" not in found[ca]:
        return f"--tls-client-ca-file {ca} holds {holds(ca)}; expected the clients' CA certificate (BEGIN CERTIFICATE)"
    reason = getattr(error, "reason", None) or str(error)
    if reason == "KEY_VALUES_MISMATCH":
        return f"--tls-key-file {key} is not the key of the certificate in --tls-cert-file {cert}"
    return f"cannot use the TLS files {', '.join(str(p) for p in found)}: {error}"
