#!/usr/bin/env bash
# Regenerates the pod-resources gRPC modules from otel_vgpu/kubernetes/kubelet/podresources.proto.
# Needs grpcio-tools (in the test extra): ./scripts/test.sh installs it into .venv.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/python -m grpc_tools.protoc -I . \
    --python_out=. --pyi_out=. --grpc_python_out=. \
    otel_vgpu/kubernetes/kubelet/podresources.proto
echo "regenerated otel_vgpu/kubernetes/kubelet/podresources_pb2{,_grpc}.py and podresources_pb2.pyi"
