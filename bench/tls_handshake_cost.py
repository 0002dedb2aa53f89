"""What one TLS handshake costs the agent, by the kind of key its certificate has.

The endpoint's handshakes run on its event loop: a flood of complete handshakes
takes the loop's time, and the key decides how much (the server signs each
handshake with it). This runs handshakes in memory (ssl.MemoryBIO, no sockets)
and times the server's side alone, with its thread's CPU time, for an ECDSA
P-256 key (what the `tls` overlay asks for) and RSA-2048 and RSA-4096 keys.

    .venv/bin/python bench/tls_handshake_cost.py [--handshakes 300]
"""

from __future__ import annotations

import argparse
import ssl
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def certificate(directory: Path, kind: str) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 with a key of `kind`."""
    import datetime  # noqa: PLC0415
    import ipaddress  # noqa: PLC0415

    from cryptography import x509  # noqa: PLC0415
    from cryptography.hazmat.primitives import hashes, serialization  # noqa: PLC0415
    from cryptography.hazmat.primitives.asymmetric import ec, rsa  # noqa: PLC0415
    from cryptography.x509.oid import NameOID  # noqa: PLC0415

    key = (
        ec.generate_private_key(ec.SECP256R1())
        if kind == "ECDSA P-256"
        else rsa.generate_private_key(public_exponent=65537, key_size=int(kind.split("-")[1]))
    )
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / f"{kind}.crt", directory / f"{kind}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


def server_cpu_per_handshake(cert: Path, key: Path, count: int) -> float:
    """Median server-side CPU seconds of `count` full handshakes (TLS 1.3, no resumption)."""
    from otel_vgpu.endpoint.tls import tls_context  # noqa: PLC0415

    server_context = tls_context(cert, key, None)
    client_context = ssl.create_default_context(cafile=str(cert))
    spent = []
    for _ in range(count):
        c_in, c_out, s_in, s_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
        client = client_context.wrap_bio(c_in, c_out, server_hostname="127.0.0.1")
        server = server_context.wrap_bio(s_in, s_out, server_side=True)
        server_cpu = 0.0
        done = {"client": False, "server": False}
        while not all(done.values()):
            for side, obj in (("client", client), ("server", server)):
                if done[side]:
                    continue
                started = time.thread_time()
                try:
                    obj.do_handshake()
                    done[side] = True
                except ssl.SSLWantReadError:
                    pass
                if side == "server":
                    server_cpu += time.thread_time() - started
            s_in.write(c_out.read())
            c_in.write(s_out.read())
        spent.append(server_cpu)
    spent.sort()
    return spent[len(spent) // 2]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--handshakes", type=int, default=300)
    args = parser.parse_args()
    print("| key | server CPU per handshake (median) | handshakes a second one core can do |")
    print("|---|---|---|")
    with tempfile.TemporaryDirectory() as directory:
        for kind in ("ECDSA P-256", "RSA-2048", "RSA-4096"):
            cert, key = certificate(Path(directory), kind)
            cost = server_cpu_per_handshake(cert, key, args.handshakes if kind != "RSA-4096" else args.handshakes // 3)
            print(f"| {kind} | {cost * 1000:.2f} ms | {1 / cost:,.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
