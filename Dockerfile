# otel-vgpu: per-pod usage of shared NVIDIA GPUs, as OpenTelemetry metrics.
#
#   docker build -t otel-vgpu .
#   docker run --rm --pid=host -p 8080:8080 otel-vgpu --simulate
#
# --pid=host: NVML (drivers from 535.113) lists only the GPU processes in the
# caller's PID namespace, and the simulated node models that; in a PID
# namespace of its own the agent reports the GPUs busy, no pod, and why.
#
# Where Docker Hub or PyPI cannot be reached, or only through a proxy that
# presents its own certificates, three things point the build elsewhere
# (BuildKit, the default builder of Docker 23 and later, or podman/buildah):
#
#   docker build \
#     --build-arg BASE_IMAGE=registry.example.com/library/python:3.12-slim-bookworm \
#     --build-arg PIP_INDEX_URL=https://pypi.example.com/simple \
#     --secret id=ca,src=/etc/ssl/certs/ca-certificates.crt \
#     -t otel-vgpu .
#
# BASE_IMAGE: the image both stages start from. It must provide python3 with
# the venv module (the official slim Python images do; so does Debian with
# python3-venv).
# PIP_INDEX_URL: the package index (PEP 503 "simple" API) the dependencies
# come from: a mirror, or a proxy of PyPI.
# The `ca` secret: a PEM bundle of every certificate authority the build is to
# trust (the system's bundle, where it holds the proxy's or the mirror's CA),
# in place of pip's own. It is mounted for the one step that downloads, and is
# in no layer of the image.
ARG BASE_IMAGE=python:3.12-slim-bookworm

FROM ${BASE_IMAGE} AS build
# pip reads it from the environment. The default is pip's own (PyPI), given
# because podman warns of an ARG without one on every build not passed it.
ARG PIP_INDEX_URL=https://pypi.org/simple
WORKDIR /src
COPY pyproject.toml README.md LICENSE constraints.txt ./
COPY otel_vgpu ./otel_vgpu
# Every dependency ships wheels, so this stage needs no compiler either; the
# versions are pinned by constraints.txt, as in CI. A `ca` secret given, pip
# (PIP_CERT) and OpenSSL (SSL_CERT_FILE: the build backend pip runs) trust it.
RUN --mount=type=secret,id=ca \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca SSL_CERT_FILE=/run/secrets/ca; fi \
    && python3 -m venv /opt/otel-vgpu \
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
