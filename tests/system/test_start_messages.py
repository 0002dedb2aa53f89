"""What the agent says when a flag or variable names a file it cannot use: one line that
names the flag (or the environment variable the value came from), the value, and what is
valid, from the real command line (`python -m otel_vgpu`), exit status 2."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from testkit.agent import ROOT, clean_env, command, free_port
from testkit.certs import make_certs

SIMULATED = ("--simulate", "--allocation-file", "{ratio}")


@dataclass(frozen=True)
class Case:
    args: tuple[str, ...]
    """The command line; `{name}` stands for a path of the `paths` fixture."""
    env: tuple[tuple[str, str], ...]
    """Environment variables, their values written as `args`' are."""
    says: tuple[str, ...]
    """What the one line holds: the flag or variable with its value, the problem, the remedy."""


CASES = {
    # The two messages that named no flag.
    "simulate-missing-flag": Case(
        ("--simulate", "/missing.yaml"),
        (),
        (
            "otel-vgpu: error: --simulate /missing.yaml: no such scenario file; give a scenario file "
            "(docs/scenario.md), or --simulate alone for the built-in node",
        ),
    ),
    "basic-auth-directory-flag": Case(
        (*SIMULATED, "--basic-auth-file", "{directory}"),
        (),
        (
            "--basic-auth-file {directory}: is a directory, not a regular file; ",
            "give a file of user:hash lines, the hash bcrypt",
        ),
    ),
    # The scenario file.
    "simulate-missing-variable": Case(
        (),
        (("OTEL_VGPU_SIMULATE", "{missing}"),),
        (
            "OTEL_VGPU_SIMULATE={missing}: no such scenario file; give a scenario file (docs/scenario.md), "
            "or OTEL_VGPU_SIMULATE=true for the built-in node",
        ),
    ),
    "simulate-directory-flag": Case(
        ("--simulate", "{directory}"),
        (),
        ("--simulate {directory}: is a directory, not a regular file; give a scenario file (docs/scenario.md)",),
    ),
    "simulate-bad-line-flag": Case(
        ("--simulate", "{bad_scenario}", "--allocation-file", "{ratio}"),
        (),
        ("--simulate {bad_scenario}:4: pods[0].processes[0].gpu: 5 is not a GPU index; valid: 0 to 0",),
    ),
    "simulate-churn-bound-flag": Case(
        ("--simulate", "{churn_scenario}", "--allocation-file", "{ratio}"),
        (),
        (
            "--simulate {churn_scenario}:2: churn.live: 1000000 pods of 100 processes each are 100000000 "
            "processes at once; valid: live x processes up to 10000",
        ),
    ),
    # The users file.
    "basic-auth-missing-variable": Case(
        SIMULATED,
        (("OTEL_VGPU_BASIC_AUTH_FILE", "{missing}"),),
        ("OTEL_VGPU_BASIC_AUTH_FILE={missing}: no such file; give a file of user:hash lines",),
    ),
    "basic-auth-bad-line-variable": Case(
        SIMULATED,
        (("OTEL_VGPU_BASIC_AUTH_FILE", "{garbage}"),),
        ("OTEL_VGPU_BASIC_AUTH_FILE={garbage}:1: no user:hash pair; expected user:hash",),
    ),
    # The ratio file.
    "ratio-directory-flag": Case(
        ("--simulate", "--allocation-file", "{directory}"),
        (),
        ("--allocation-file {directory}: is a directory, not a regular file; expected one whole number from 1",),
    ),
    "ratio-directory-variable": Case(
        ("--simulate",),
        (("OTEL_VGPU_ALLOCATION_FILE", "{directory}"),),
        ("OTEL_VGPU_ALLOCATION_FILE={directory}: is a directory, not a regular file; expected one whole number",),
    ),
    "ratio-not-a-number-variable": Case(
        ("--simulate",),
        (("OTEL_VGPU_ALLOCATION_FILE", "{garbage}"),),
        ("OTEL_VGPU_ALLOCATION_FILE={garbage}:1: 'garbage' is not a number; expected one whole number",),
    ),
    "ratio-missing-default": Case(
        # Run where no gpu_allocation.txt is (the test's folder), on a real node's flags.
        ("--proc-root", "/proc"),
        (),
        (
            "--allocation-file gpu_allocation.txt: no such file; ",
            "that is the default path; give the ratio file's path with --allocation-file or OTEL_VGPU_ALLOCATION_FILE",
        ),
    ),
    # The TLS files.
    "tls-cert-directory-variable": Case(
        (*SIMULATED, "--tls-key-file", "{key}"),
        (("OTEL_VGPU_TLS_CERT_FILE", "{directory}"),),
        (
            "OTEL_VGPU_TLS_CERT_FILE={directory}: is a directory, not a regular file; "
            "give a PEM certificate (BEGIN CERTIFICATE)",
        ),
    ),
    "tls-key-garbage-flag": Case(
        (*SIMULATED, "--tls-cert-file", "{cert}", "--tls-key-file", "{garbage}"),
        (),
        ("--tls-key-file {garbage} holds no PEM block; expected a PEM private key (BEGIN PRIVATE KEY)",),
    ),
    "tls-client-ca-missing-flag": Case(
        (*SIMULATED, "--tls-cert-file", "{cert}", "--tls-key-file", "{key}", "--tls-client-ca-file", "{missing}"),
        (),
        ("--tls-client-ca-file {missing}: no such file; give the clients' CA certificate (BEGIN CERTIFICATE)",),
    ),
    "tls-key-alone-variable": Case(
        SIMULATED,
        (("OTEL_VGPU_TLS_KEY_FILE", "{key}"),),
        (
            "OTEL_VGPU_TLS_KEY_FILE={key} without --tls-cert-file or OTEL_VGPU_TLS_CERT_FILE: give both, "
            "a PEM certificate (BEGIN CERTIFICATE) and a PEM private key (BEGIN PRIVATE KEY)",
        ),
    ),
    "tls-client-ca-alone-flag": Case(
        (*SIMULATED, "--tls-client-ca-file", "{cert}"),
        (),
        (
            "--tls-client-ca-file {cert} asks for client certificates over TLS, which needs "
            "--tls-cert-file or OTEL_VGPU_TLS_CERT_FILE and --tls-key-file or OTEL_VGPU_TLS_KEY_FILE",
        ),
    ),
    # The Kubernetes configuration.
    "kubeconfig-directory-flag": Case(
        (*SIMULATED, "--kubeconfig", "{directory}"),
        (),
        (
            "--kubeconfig {directory}: is a directory, not a regular file; give a kubeconfig file "
            "(kubectl config view --raw --minify writes one)",
        ),
    ),
    "kubeconfig-garbage-variable": Case(
        SIMULATED,
        (("OTEL_VGPU_KUBECONFIG", "{garbage}"),),
        (
            "OTEL_VGPU_KUBECONFIG={garbage}: not a kubeconfig (a YAML mapping with clusters and contexts); "
            "give a kubeconfig file",
        ),
    ),
    "service-account-without-namespace-flag": Case(
        (*SIMULATED, "--service-account-dir", "{service_account}"),
        (("KUBERNETES_SERVICE_HOST", "127.0.0.1"), ("KUBERNETES_SERVICE_PORT", "1")),
        (
            "--service-account-dir {service_account}: the pod's service account cannot be used (",
            "give the directory of its token, ca.crt and namespace, or a kubeconfig with --kubeconfig or "
            "OTEL_VGPU_KUBECONFIG",
        ),
    ),
    # /proc, on a real node's flags: refused before the driver is asked for.
    "proc-root-missing-flag": Case(
        ("--allocation-file", "{ratio}", "--proc-root", "{missing}"),
        (),
        ("--proc-root {missing}: no such directory; give the /proc of the host's PID namespace",),
    ),
    "proc-root-file-variable": Case(
        ("--allocation-file", "{ratio}"),
        (("OTEL_VGPU_PROC_ROOT", "{ratio}"),),
        ("OTEL_VGPU_PROC_ROOT={ratio}: not a directory; give the /proc of the host's PID namespace",),
    ),
    # The OTLP exporter's files and protocol, from the SDK's own variables.
    "otlp-certificate-missing-variable": Case(
        SIMULATED,
        (("OTEL_EXPORTER_OTLP_ENDPOINT", "https://127.0.0.1:4317"), ("OTEL_EXPORTER_OTLP_CERTIFICATE", "{missing}")),
        (
            "OTEL_EXPORTER_OTLP_CERTIFICATE={missing}: no such file; "
            "give the Collector's CA certificate in PEM (BEGIN CERTIFICATE)",
        ),
    ),
    "otlp-client-key-garbage-variable": Case(
        SIMULATED,
        (
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://127.0.0.1:4317"),
            ("OTEL_EXPORTER_OTLP_METRICS_CLIENT_KEY", "{cert}"),
        ),
        (
            "OTEL_EXPORTER_OTLP_METRICS_CLIENT_KEY={cert}: holds no PRIVATE KEY block; "
            "give the client certificate's private key in PEM (BEGIN PRIVATE KEY)",
        ),
    ),
    "otlp-protocol-variable": Case(
        SIMULATED,
        (("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317"), ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpcs")),
        ("OTEL_EXPORTER_OTLP_PROTOCOL='grpcs': expected one of grpc, http/protobuf",),
    ),
    # The names of the OTLP push: the two there are.
    "otlp-names-flag": Case(
        (*SIMULATED, "--otlp-names", "otel"),
        (),
        (
            "otel-vgpu: error: argument --otlp-names: invalid OTLP names 'otel': expected vgpu (the agent's own, "
            "as scraped) or semconv (OpenTelemetry's semantic conventions)",
        ),
    ),
    "otlp-names-variable": Case(
        SIMULATED,
        (("OTEL_VGPU_OTLP_NAMES", "hw"),),
        ("OTEL_VGPU_OTLP_NAMES: invalid OTLP names 'hw': expected vgpu (the agent's own, as scraped) or semconv",),
    ),
    # Where to listen: named as given, with the flag and variable to change.
    "address-unresolvable-flag": Case(
        (*SIMULATED, "--address", "no-such-host.invalid"),
        (),
        (
            "(--address no-such-host.invalid, --port ",
            "; choose an address of this host with --address or OTEL_VGPU_ADDRESS (0.0.0.0: all of them)",
        ),
    ),
    "address-not-here-variable": Case(
        SIMULATED,
        # TEST-NET-1 (RFC 5737): no host has it.
        (("OTEL_VGPU_ADDRESS", "192.0.2.1"),),
        (
            "cannot listen on 192.0.2.1:",
            "(OTEL_VGPU_ADDRESS=192.0.2.1, --port ",
            "; choose an address of this host with --address or OTEL_VGPU_ADDRESS",
        ),
    ),
    # Two lists that exclude each other, one from a flag and one from a variable.
    "allowlist-and-denylist": Case(
        (*SIMULATED, "--metric-allowlist", "vgpu_pod_.*"),
        (("OTEL_VGPU_METRIC_DENYLIST", "vgpu_gpu_.*"),),
        (
            "--metric-allowlist vgpu_pod_.* and OTEL_VGPU_METRIC_DENYLIST=vgpu_gpu_.* are mutually exclusive",
            "give one list",
        ),
    ),
}


@pytest.fixture
def paths(tmp_path: Path) -> dict[str, str]:
    certs = make_certs(tmp_path / "pki")
    directory = tmp_path / "a-directory"
    directory.mkdir()
    garbage = tmp_path / "garbage.txt"
    garbage.write_text("garbage\n")
    ratio = tmp_path / "ratio.txt"
    ratio.write_text("2\n")
    bad_scenario = tmp_path / "bad.yaml"
    bad_scenario.write_text("gpus:\n  - memory: 80GiB\npods:\n  - {name: a, processes: [{gpu: 5}]}\n")
    churn_scenario = tmp_path / "churn.yaml"
    churn_scenario.write_text("gpus: [{}]\nchurn: {pods: 10, live: 1000000, lifetime_s: 1, processes: 100}\n")
    service_account = tmp_path / "serviceaccount"
    service_account.mkdir()
    (service_account / "token").write_text("not-a-token\n")  # no namespace file beside it
    return {
        "directory": str(directory),
        "missing": str(tmp_path / "missing.yaml"),
        "garbage": str(garbage),
        "ratio": str(ratio),
        "bad_scenario": str(bad_scenario),
        "churn_scenario": str(churn_scenario),
        "cert": str(certs.cert),
        "key": str(certs.key),
        "service_account": str(service_account),
    }


@pytest.mark.parametrize("name", CASES)
def test_a_file_it_cannot_use_is_named_by_its_flag_or_variable_with_the_remedy(
    name: str, paths: dict[str, str], tmp_path: Path
) -> None:
    case = CASES[name]
    args = [arg.format(**paths) for arg in case.args]
    env = clean_env(**{variable: value.format(**paths) for variable, value in case.env})
    # Where no gpu_allocation.txt is, so that only the default case meets the default path;
    # the package imported from this tree, wherever the test runs it.
    env["PYTHONPATH"] = str(ROOT)
    if "--address" not in args and "OTEL_VGPU_ADDRESS" not in env:
        args += ["--address", "127.0.0.1"]
    result = subprocess.run(
        command(*args, "--port", str(free_port())),
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
        cwd=tmp_path,
        check=False,
    )
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert lines[0].startswith("otel-vgpu: error: "), lines[0]
    for fragment in case.says:
        assert fragment.format(**paths) in lines[0], lines[0]
