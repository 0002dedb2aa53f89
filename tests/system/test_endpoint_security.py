"""HTTPS, mutual TLS and basic auth on the endpoint, with a real HTTPS client."""

from __future__ import annotations

import base64
import hashlib
import http.client
import os
import ssl
from collections.abc import Callable
from pathlib import Path

import bcrypt
import pytest

from otel_vgpu.endpoint.auth import Attempt, AuthFileError, BasicAuth, Verdict, network_of, parse_users
from testkit.agent import free_port, run_to_exit, running_agent, wait_until
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
    # One kind and cost for every user: a mixed file is refused (test_a_users_file_that_mixes_costs_is_refused).
    hashed = bcrypt.hashpw(b"bcrypt-secret", bcrypt.gensalt(rounds=4)).decode()
    collector = bcrypt.hashpw(b"sha-secret", bcrypt.gensalt(rounds=4)).decode()
    path.write_text(f"# scrapers\nprometheus:{hashed}\ncollector:{collector}\n")
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


@pytest.mark.parametrize(
    ("second", "named"),
    [
        (
            lambda: "sha256:" + hashlib.sha256(b"x").hexdigest(),
            "'bob' has a sha256 hash and 'alice' a bcrypt cost 4 one",
        ),
        (lambda: bcrypt.hashpw(b"x", bcrypt.gensalt(rounds=5)).decode(), "'bob' has a bcrypt cost 5 hash"),
    ],
)
def test_a_users_file_that_mixes_costs_is_refused(
    tmp_path: Path, ratio_file: Path, second: Callable[[], str], named: str
) -> None:
    # An unknown user is checked against one decoy cost: mixed costs would tell users apart by timing.
    users = tmp_path / "users"
    users.write_text(f"alice:{bcrypt.hashpw(b'x', bcrypt.gensalt(rounds=4)).decode()}\nbob:{second()}\n")
    result = run_to_exit(["--simulate", "--allocation-file", str(ratio_file), "--basic-auth-file", str(users)])
    assert result.returncode == 2
    assert f"{users}:2: user {named}" in result.stderr, result.stderr
    assert "same kind of hash and bcrypt cost" in result.stderr


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


def test_what_a_client_certificate_needs(certs: Certs, tmp_path: Path, ratio_file: Path) -> None:
    # What TLS client authentication checks (OpenSSL's ssl_client purpose, as Go's crypto/tls
    # under Prometheus' exporter-toolkit does): a chain to the client CA, valid now, and, where
    # the certificate names extended key usages, clientAuth among them (RFC 5280 4.2.1.12). A
    # certificate naming none serves any purpose (RFC 5280); one marked a CA is accepted too:
    # whoever holds a CA key under the client CA can issue a client certificate anyway.
    from dataclasses import replace as with_client  # noqa: PLC0415

    from cryptography.x509.oid import ExtendedKeyUsageOID  # noqa: PLC0415

    from testkit.certs import issue_client  # noqa: PLC0415

    client_auth, server_auth = ExtendedKeyUsageOID.CLIENT_AUTH, ExtendedKeyUsageOID.SERVER_AUTH
    cases = {
        "client-auth": ([client_auth], False, 1.0, True),
        "no-extended-key-usage": (None, False, 1.0, True),
        "client-and-server-auth": ([server_auth, client_auth], False, 1.0, True),
        "marked-a-ca": ([client_auth], True, 1.0, True),
        "server-auth-only": ([server_auth], False, 1.0, False),
        "expired": ([client_auth], False, -1.0, False),
    }
    args = tls_args(ratio_file, certs, "--tls-client-ca-file", str(certs.ca))
    with running_agent(*args, https_ca=certs.ca, https_client=certs) as agent:
        for name, (usages, ca, days, accepted) in cases.items():
            cert, key = issue_client(certs, name, usages, ca=ca, valid_days=days)
            client = with_client(certs, client_cert=cert, client_key=key)
            if accepted:
                assert https_get(agent.url, certs.ca, client=client) == 200, name
            else:
                with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
                    https_get(agent.url, certs.ca, client=client)
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
        f"otel-vgpu: error: --basic-auth-file {users}:1: the hash of 'alice' is neither bcrypt nor sha256; "
        "expected user:hash, the hash bcrypt ($2b$<cost 04-31>$...) or sha256:<64 hex digits>"
    ]


def test_tls_flags_must_come_together(certs: Certs, ratio_file: Path) -> None:
    result = run_to_exit(["--simulate", "--allocation-file", str(ratio_file), "--tls-cert-file", str(certs.cert)])
    assert result.returncode == 2
    assert f"--tls-cert-file {certs.cert} without --tls-key-file or OTEL_VGPU_TLS_KEY_FILE: give both" in result.stderr


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
        (
            (certs.cert, tmp_path / "absent.pem"),
            f"--tls-key-file {tmp_path / 'absent.pem'}: no such file; give a PEM private key (BEGIN PRIVATE KEY)",
        ),
        (
            (tmp_path / "gone.pem", certs.key),
            f"--tls-cert-file {tmp_path / 'gone.pem'}: no such file; give a PEM certificate (BEGIN CERTIFICATE)",
        ),
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
    from testkit.manifests import daemonset  # noqa: PLC0415

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


def replace(path: Path, text: str | bytes) -> None:
    """As a Secret volume update or an editor's save does: a whole new file in the old one's place."""
    new = path.with_name(path.name + ".new")
    new.write_bytes(text if isinstance(text, bytes) else text.encode())
    os.replace(new, path)


def credentials_errors(agent_url: str, ca: Path, auth: tuple[str, str]) -> float:
    import re  # noqa: PLC0415

    context = ssl.create_default_context(cafile=str(ca))
    host, port = agent_url.removeprefix("http://").split(":")
    connection = http.client.HTTPSConnection(host, int(port), context=context, timeout=10)
    headers = {"Authorization": "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()}
    try:
        connection.request("GET", "/metrics", headers=headers)
        body = connection.getresponse().read().decode()
    finally:
        connection.close()
    found = re.search(r'vgpu_agent_collection_errors_total\{stage="credentials"\} (\S+)', body)
    return float(found.group(1)) if found else 0.0


def alice(password: str) -> str:
    """A users file of one user, alice, with this password (bcrypt, the cheapest cost)."""
    return "alice:" + bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode() + "\n"


def test_a_revoked_password_stops_working_and_a_broken_users_file_keeps_the_last(
    certs: Certs, tmp_path: Path, ratio_file: Path
) -> None:
    users = tmp_path / "users"
    users.write_text(alice("old-password"))
    args = tls_args(ratio_file, certs, "--basic-auth-file", str(users))
    with running_agent(*args, https_ca=certs.ca) as agent:
        assert https_get(agent.url, certs.ca, ("alice", "old-password")) == 200
        replace(users, alice("new-password"))
        wait_until(
            lambda: (
                https_get(agent.url, certs.ca, ("alice", "new-password")) == 200
                and https_get(agent.url, certs.ca, ("alice", "old-password")) == 401
            ),
            what="the new users file in force, the old password refused",
        )
        replace(users, "alice:not-a-hash\n")
        wait_until(lambda: credentials_errors(agent.url, certs.ca, ("alice", "new-password")) >= 1, what="counted")
        assert https_get(agent.url, certs.ca, ("alice", "new-password")) == 200, "the last good file stays"
        code, log = agent.stop()
    assert code == 0
    assert log.count("cannot be used") == 1 and "keeping the previous version" in log, log
    assert log.count("the users file") >= 2 and "reread: the new version is in force" in log, log


def test_a_renewed_certificate_is_served_without_a_restart_and_a_broken_one_keeps_the_last(
    certs: Certs, tmp_path: Path, ratio_file: Path
) -> None:
    renewed = make_certs(tmp_path / "renewed")  # another CA: only the new certificate passes its check
    with running_agent(*tls_args(ratio_file, certs), https_ca=certs.ca) as agent:
        assert https_get(agent.url, certs.ca) == 200
        replace(certs.key, renewed.key.read_bytes())
        replace(certs.cert, renewed.cert.read_bytes())

        def serves_the_renewed() -> bool:
            try:
                return https_get(agent.url, renewed.ca) == 200
            except ssl.SSLError:  # still the old certificate
                return False

        wait_until(serves_the_renewed, what="the renewed certificate served")
        replace(certs.key, b"-----BEGIN PRIVATE KEY-----\nbroken\n-----END PRIVATE KEY-----\n")
        wait_until(lambda: credentials_errors(agent.url, renewed.ca, ("", "")) >= 1, what="the broken key counted")
        assert serves_the_renewed(), "the last good certificate and key stay"
        code, log = agent.stop()
    assert code == 0
    assert log.count("the TLS certificate and key changed and cannot be used") == 1, log


def attempts(auth: BasicAuth) -> Callable[[str, str], Verdict]:
    """prometheus's login with a password from a peer, checked as the endpoint checks it."""

    def attempt(password: str, peer: str) -> Verdict:
        header = "Basic " + base64.b64encode(f"prometheus:{password}".encode()).decode()
        verdict = auth.decide(header, peer)
        return auth.verify(verdict) if isinstance(verdict, Attempt) else verdict

    return attempt


def test_failures_spread_over_a_network_throttle_the_network_not_a_known_good_scraper() -> None:
    now = [1000.0]
    auth = BasicAuth({"prometheus": f"sha256:{hashlib.sha256(b'right').hexdigest()}"}, clock=lambda: now[0])

    attempt = attempts(auth)

    assert attempt("right", "10.1.2.200") is Verdict.ALLOW  # the scraper's credential, remembered
    # 20 addresses of 10.1.2.0/24, one wrong password each: no address reaches its own 5
    for host in range(1, 21):
        assert attempt(f"guess-{host}", f"10.1.2.{host}") is Verdict.DENY
    assert attempt("guess-1-again", "10.1.2.1") is Verdict.THROTTLED, "the network is throttled for its failed peers"
    # an address of the network that has not failed gets one check, and is then under the network's throttle
    assert attempt("another-guess", "10.1.2.77") is Verdict.DENY
    assert attempt("and-another", "10.1.2.77") is Verdict.THROTTLED
    assert attempt("another-guess", "10.1.3.77") is Verdict.DENY, "the next network is not throttled"
    assert attempt("right", "10.1.2.200") is Verdict.ALLOW, "a credential that passed is not held up"
    now[0] += 61
    assert attempt("yet-another", "10.1.2.1") is Verdict.DENY, "the throttle ends"


def test_a_repeated_known_bad_password_costs_its_sender_and_no_neighbour() -> None:
    # A neighbour repeating one wrong password (answered from memory, no check) must
    # not lock out a scraper of its /24 whose password is not remembered yet.
    now = [1000.0]
    auth = BasicAuth({"prometheus": f"sha256:{hashlib.sha256(b'right').hexdigest()}"}, clock=lambda: now[0])

    attempt = attempts(auth)

    checks = 0
    for _ in range(1000):
        verdict = auth.decide("Basic " + base64.b64encode(b"prometheus:wrong").decode(), "10.1.2.7")
        if isinstance(verdict, Attempt):
            checks += 1
            verdict = auth.verify(verdict)
        assert verdict in (Verdict.DENY, Verdict.THROTTLED)
    assert checks == 1, "a known-bad password is checked once"
    assert attempt("anything", "10.1.2.7") is Verdict.THROTTLED, "its sender is throttled"
    assert attempt("right", "10.1.2.8") is Verdict.ALLOW, "its neighbour's first attempt is checked, and passes"
    # A network throttled by new wrong passwords from many of its addresses still lets a
    # scraper that has not failed in with its first attempt.
    for host in range(100, 130):
        attempt(f"guess-{host}", f"10.1.2.{host}")
    assert attempt("right", "10.1.2.9") is Verdict.ALLOW


@pytest.mark.parametrize(
    ("peer", "network"),
    [
        ("192.0.2.77", "192.0.2.0/24"),
        ("2001:db8:1:2:3:4:5:6", "2001:db8:1:2::/64"),
        ("::ffff:192.0.2.77", "192.0.2.0/24"),
        ("not-an-address", "not-an-address"),
    ],
)
def test_the_network_of_a_peer(peer: str, network: str) -> None:
    assert network_of(peer) == network


def fifo_in_place_of(path: Path) -> None:
    """A FIFO where the file was, as a misconfigured volume or a hostile neighbour leaves one."""
    path.unlink()
    os.mkfifo(path)


@pytest.mark.parametrize("which", ["users", "cert", "key", "client-ca"])
@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "directory"])
def test_a_credential_file_that_is_no_regular_file_stops_the_start_in_one_line(
    which: str, kind: str, certs: Certs, users: Path, ratio_file: Path, tmp_path: Path
) -> None:
    # Each flag's file in turn: a FIFO (whose open would block the start for good), a link
    # to /dev/zero (read until memory runs out), a directory. Exit 2, one line, at once.
    files = {"users": users, "cert": certs.cert, "key": certs.key, "client-ca": certs.ca}
    flags = {"users": "--basic-auth-file", "cert": "--tls-cert-file", "key": "--tls-key-file"}
    target = tmp_path / f"bad-{which}"
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "dev-zero":
        target.symlink_to("/dev/zero")
    else:
        target.mkdir()
    files[which] = target
    args = [
        *tls_args(ratio_file, certs)[:3],
        "--tls-cert-file",
        str(files["cert"]),
        "--tls-key-file",
        str(files["key"]),
    ]
    args += ["--tls-client-ca-file", str(files["client-ca"]), "--basic-auth-file", str(files["users"])]
    result = run_to_exit([*args, "--port", str(free_port())], timeout=20)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    what = {"fifo": "is a FIFO, not a regular file", "dev-zero": "is a character device, not a regular file"}
    assert str(target) in lines[0] and what.get(kind, "is a directory, not a regular file") in lines[0], lines[0]
    assert flags.get(which, "--tls-client-ca-file") in lines[0] or which == "users", lines[0]


def test_credential_files_turned_fifo_or_endless_on_reload_keep_the_last_and_never_freeze_the_others(
    certs: Certs, tmp_path: Path, ratio_file: Path
) -> None:
    users = tmp_path / "users"
    users.write_text(alice("first"))
    # Each scrape sweeps, so that each reads the errors counted so far (with the agent's own
    # sweeps, a scrape serves the last sweep's body).
    scraped = ("--sweep-interval", "0", "--min-interval", "0")
    args = tls_args(ratio_file, certs, "--basic-auth-file", str(users), *scraped)
    with running_agent(*args, https_ca=certs.ca) as agent:
        assert https_get(agent.url, certs.ca, ("alice", "first")) == 200
        # The key becomes a FIFO: its reread must not block the thread the users file shares.
        fifo_in_place_of(certs.key)
        wait_until(lambda: credentials_errors(agent.url, certs.ca, ("alice", "first")) >= 1, what="the FIFO counted")
        replace(users, alice("second"))
        wait_until(
            lambda: (
                https_get(agent.url, certs.ca, ("alice", "second")) == 200
                and https_get(agent.url, certs.ca, ("alice", "first")) == 401
            ),
            what="the new users file in force while the key is a FIFO",
        )
        # The users file becomes a link to /dev/zero: refused, memory untouched, the last file kept.
        before = credentials_errors(agent.url, certs.ca, ("alice", "second"))
        users.unlink()
        users.symlink_to("/dev/zero")
        wait_until(
            lambda: credentials_errors(agent.url, certs.ca, ("alice", "second")) > before, what="/dev/zero counted"
        )
        assert https_get(agent.url, certs.ca, ("alice", "second")) == 200, "the last good users file stays"
        from testkit.procstat import rss_mib  # noqa: PLC0415

        assert rss_mib(agent.process.pid) < 200, "the endless file was not read"
        code, log = agent.stop()
    assert code == 0
    assert "is a FIFO, not a regular file" in log and "is a character device, not a regular file" in log, log
