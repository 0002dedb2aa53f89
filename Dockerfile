# otel-vgpu: per-pod usage of shared NVIDIA GPUs, as OpenTelemetry metrics.
#
#   docker build -t otel-vgpu .
#   docker run --rm --pid=host -p 8080:8080 otel-vgpu --simulate
#
# --pid=host: NVML (drivers from 535.113) lists only the GPU processes in the
# caller's PID namespace, and the simulated node models that; in a PID
# namespace of its own the agent reports the GPUs busy, no pod, and why.
#
# BASE_IMAGE must provide python3 with the venv module (the official slim
# Python images do; so does Debian with python3-venv).
ARG BASE_IMAGE=python:3.12-slim-bookworm

FROM ${BASE_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml README.md LICENSE constraints.txt ./
COPY otel_vgpu ./otel_vgpu
# Every dependency ships wheels, so this stage needs no compiler either; the
# versions are pinned by constraints.txt, as in CI.
RUN python3 -m venv /opt/otel-vgpu \
    && /opt/otel-vgpu/bin/python -m pip install --no-cache-dir --disable-pip-version-check \
        -c constraints.txt /src \
    && /opt/otel-vgpu/bin/python -m pip uninstall --yes pip

FROM ${BASE_IMAGE}
ARG VERSION=0.2.0
# The commit built (docker build --build-arg REVISION=$(git rev-parse HEAD)).
ARG REVISION=unknown
LABEL org.opencontainers.image.title="otel-vgpu" \
      org.opencontainers.image.description="Per-pod usage of shared NVIDIA GPUs (time-slicing, MPS, MIG, HAMi, DRA) as OpenTelemetry metrics for Prometheus and OTLP" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.vendor="otel-vgpu" \
      org.opencontainers.image.url="https://github.com/otel-vgpu/otel-vgpu" \
      org.opencontainers.image.documentation="https://github.com/otel-vgpu/otel-vgpu#readme" \
      org.opencontainers.image.source="https://github.com/otel-vgpu/otel-vgpu"
COPY --from=build /opt/otel-vgpu /opt/otel-vgpu
COPY LICENSE /usr/share/doc/otel-vgpu/LICENSE
COPY gpu_allocation.txt /etc/otel-vgpu/gpu_allocation.txt
ENV PATH=/opt/otel-vgpu/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    OTEL_VGPU_ALLOCATION_FILE=/etc/otel-vgpu/gpu_allocation.txt
# A numeric non-root user, so runAsNonRoot can verify it. The agent handles
# SIGTERM itself (Python as PID 1 would otherwise ignore it).
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["otel-vgpu"]
