"""HTTPS, mutual TLS and basic auth on the endpoint, with a real HTTPS client."""

from __future__ import annotations

import base64
import hashlib
import http.client
import ssl
from pathlib import Path

import bcrypt
import pytest

from otel_vgpu.export.auth import Attempt, AuthFileError, BasicAuth, Verdict, parse_users
from testkit.agent import free_port, run_to_exit, running_agent
from testkit.certs import Certs, make_certs


def https_get(
    url: str, ca: Path, auth: tuple[str, str] | None = None, client: Certs | None = None, path: str = "/metrics"
) -> int:
    context = ssl.create_default_context(cafile=str(ca))
    if client is not None:
        context.load_cert_chain(client.client_cert, client.client_key)
    host, port = url.removeprefix("http://").split(":")
    connection = http.client.HTTPSConnection(host, int(port), context=context, timeout=10)
    headers = {}
    if auth is not None:
        headers["Authorization"] = "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
    try:
        connection.request("GET", path, headers=headers)
        return connection.getresponse().status
    finally:
        connection.close()


@pytest.fixture
def certs(tmp_path: Path) -> Certs:
    return make_certs(tmp_path / "pki")


@pytest.fixture
def users(tmp_path: Path) -> Path:
    path = tmp_path / "users"
    hashed = bcrypt.hashpw(b"bcrypt-secret", bcrypt.gensalt(rounds=4)).decode()
    path.write_text(f"# scrapers\nprometheus:{hashed}\ncollector:sha256:{hashlib.sha256(b'sha-secret').hexdigest()}\n")
    return path


def tls_args(ratio_file: Path, certs: Certs, *extra: str) -> list[str]:
    """The simulated agent serving HTTPS with the test certificate."""
    return [
        "--simulate", "--allocation-file", str(ratio_file),
        "--tls-cert-file", str(certs.cert), "--tls-key-file", str(certs.key), *extra,
    ]  # fmt: skip


def test_https_with_basic_auth(certs: Certs, users: Path, ratio_file: Path) -> None:
    args = tls_args(ratio_file, certs, "--basic-auth-file", str(users))
    with running_agent(*args, https_ca=certs.ca) as agent:
        assert https_get(agent.url, certs.ca, ("prometheus", "bcrypt-secret")) == 200
        assert https_get(agent.url, certs.ca, ("prometheus", "bcrypt-secret")) == 200  # cached check
        assert https_get(agent.url, certs.ca, ("collector", "sha-secret")) == 200
        assert https_get(agent.url, certs.ca, ("prometheus", "wrong")) == 401
        assert https_get(agent.url, certs.ca, ("nobody", "sha-secret")) == 401
        assert https_get(agent.url, certs.ca) == 401
        # plain HTTP to the TLS port gets no HTTP answer
        host, port = agent.url.removeprefix("http://").split(":")
        plain = http.client.HTTPConnection(host, int(port), timeout=5)
        with pytest.raises((http.client.HTTPException, ConnectionError, OSError)):
            plain.request("GET", "/metrics")
            plain.getresponse()
        plain.close()
        code, _ = agent.stop()
    assert code == 0


def test_mutual_tls(certs: Certs, tmp_path: Path, ratio_file: Path) -> None:
    args = tls_args(ratio_file, certs, "--tls-client-ca-file", str(certs.ca))
    stranger = make_certs(tmp_path / "stranger")
    with running_agent(*args, https_ca=certs.ca, https_client=certs) as agent:
        assert https_get(agent.url, certs.ca, client=certs) == 200
        # Without a certificate: /metrics is refused, the kubelet's probes (which send none) pass.
        assert https_get(agent.url, certs.ca) == 403
        assert https_get(agent.url, certs.ca, path="/healthz") == 200
        assert https_get(agent.url, certs.ca, path="/readyz") == 200
        # A certificate the CA did not sign fails the handshake.
        with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
            https_get(agent.url, certs.ca, client=stranger)
        agent.stop()


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("", "no users"),
        ("alice\n", "users:1: no user:hash pair"),
        ("alice:plaintext\n", "users:1: the hash of 'alice' is neither bcrypt nor sha256"),
        (f"a:sha256:{'0' * 64}\na:sha256:{'1' * 64}\n", "users:2: user 'a' appears twice"),
    ],
)
def test_bad_credentials_file(text: str, fragment: str) -> None:
    with pytest.raises(AuthFileError, match=fragment):
        parse_users(text, "users")


def test_bad_credentials_file_stops_the_agent(tmp_path: Path, ratio_file: Path) -> None:
    users = tmp_path / "users"
    users.write_text("alice:secret\n")
    result = run_to_exit(
        [
            "--simulate",
            "--allocation-file",
            str(ratio_file),
            "--port",
            str(free_port()),
            "--basic-auth-file",
            str(users),
        ]
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"otel-vgpu: error: {users}:1: the hash of 'alice' is neither bcrypt nor sha256; "
        "expected user:hash, the hash bcrypt ($2b$<cost 04-31>$...) or sha256:<64 hex digits>"
    ]


def test_tls_flags_must_come_together(certs: Certs, ratio_file: Path) -> None:
    result = run_to_exit(["--simulate", "--allocation-file", str(ratio_file), "--tls-cert-file", str(certs.cert)])
    assert result.returncode == 2 and "--tls-cert-file and --tls-key-file go together" in result.stderr


def test_wrong_tls_files_are_named_with_what_they_should_hold(certs: Certs, ratio_file: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty.pem"
    empty.write_text("")
    cases = [
        (
            (certs.key, certs.cert),
            f"the TLS certificate and key are swapped: --tls-cert-file {certs.key} holds a private key and "
            f"--tls-key-file {certs.cert} a certificate",
        ),
        ((certs.key, certs.key), f"--tls-cert-file {certs.key} holds PRIVATE KEY; expected a PEM certificate"),
        ((certs.cert, certs.cert), f"--tls-key-file {certs.cert} holds CERTIFICATE; expected a PEM private key"),
        ((certs.cert, empty), f"--tls-key-file {empty} holds no PEM block; expected a PEM private key"),
        (
            (certs.cert, certs.client_key),
            f"--tls-key-file {certs.client_key} is not the key of the certificate in --tls-cert-file {certs.cert}",
        ),
        ((certs.cert, tmp_path / "absent.pem"), "cannot read the TLS files: No such file or directory"),
    ]
    for (cert, key), expected in cases:
        args = ["--simulate", "--allocation-file", str(ratio_file), "--tls-cert-file", str(cert)]
        result = run_to_exit([*args, "--tls-key-file", str(key)])
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and len(lines) == 1, result.stderr
        assert expected in lines[0], lines[0]


def check(auth: BasicAuth, header: str | None, peer: str = "10.0.0.1") -> Verdict:
    verdict = auth.decide(header, peer)
    return auth.verify(verdict) if isinstance(verdict, Attempt) else verdict


def test_malformed_authorization_headers_are_refused() -> None:
    auth = BasicAuth({"u": f"sha256:{hashlib.sha256(b'p').hexdigest()}"})
    token = base64.b64encode(b"u:p").decode()
    # RFC 7617: the scheme is case-insensitive.
    for scheme in ("Basic", "basic", "BASIC"):
        assert check(auth, f"{scheme} {token}") is Verdict.ALLOW, scheme
    for header in (
        None,
        "",
        "Bearer x",
        "Basic !!!",
        "Basic " + base64.b64encode(b"no-colon").decode(),
        "Basic " + base64.b64encode(b"\xff\xfe").decode(),
    ):
        assert check(auth, header, peer=f"malformed-{header!r}") is Verdict.DENY, header


def test_the_tls_overlays_probes_pass_with_mutual_tls_on(certs: Certs, ratio_file: Path) -> None:
    """The probes as the `tls` overlay renders them (HTTPS, the kubelet sends
    no client certificate and checks none) against an agent that also
    requires client certificates on /metrics."""
    from .test_kustomize import daemonset  # noqa: PLC0415

    container = daemonset("tls")["spec"]["template"]["spec"]["containers"][0]
    probes = [container["livenessProbe"]["httpGet"], container["readinessProbe"]["httpGet"]]
    assert {probe["scheme"] for probe in probes} == {"HTTPS"}
    args = tls_args(ratio_file, certs, "--tls-client-ca-file", str(certs.ca))
    with running_agent(*args, https_ca=certs.ca, https_client=certs) as agent:
        host, port = agent.url.removeprefix("http://").split(":")
        kubelet = ssl.create_default_context()
        kubelet.check_hostname = False
        kubelet.verify_mode = ssl.CERT_NONE  # the kubelet does not verify a probe's certificate
        for probe in probes:
            connection = http.client.HTTPSConnection(host, int(port), context=kubelet, timeout=10)
            try:
                connection.request("GET", probe["path"])
                assert connection.getresponse().status == 200, probe
            finally:
                connection.close()
        agent.stop()
