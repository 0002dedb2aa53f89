#!/usr/bin/env bash
# Builds the container image the tests run (tests/test_image.py) into its own podman
# storage under WORK: a Debian root from debootstrap (kept per machine for a week)
# imported as the base, then the Dockerfile's two stages. Leaves WORK/built (the tag) or WORK/failed (the log's tail).
# scripts/test.sh starts it first, in the background and niced, so that it builds while
# the rest installs and runs; testkit/image_build.py waits for its mark. With --clean,
# removes WORK's containers, images and the folder itself.
#   scripts/build-test-image.sh [--clean] WORK
set -uo pipefail
clean=false
if [ "${1:-}" = "--clean" ]; then
    clean=true
    shift
fi
work=${1:?usage: scripts/build-test-image.sh [--clean] WORK}
root=$(cd "$(dirname "$0")/.." && pwd)
tag=localhost/otel-vgpu:test
ca_bundle=/etc/ssl/certs/ca-certificates.crt
mkdir -p "$work"
log="$work/build.log"
podman=(nice -n 15 podman --root "$work/storage" --runroot "$work/run" --runtime runc --storage-driver vfs)
if $clean; then
    "${podman[@]}" rm --all --force >/dev/null 2>&1
    "${podman[@]}" rmi --all --force >/dev/null 2>&1
    rm -rf "$work"
    exit 0
fi
# The Debian root is kept per machine for a week: debootstrap is most of a build (46 s of
# CPU of its 65), and the root changes only with Debian's point releases. A machine's first
# build, or one a week later, makes it anew.
cache=${OTEL_VGPU_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/otel-vgpu}
base_tar=$cache/debian-bookworm-slim-python3.tar
debian_root() {
    if [ -s "$base_tar" ] && [ -n "$(find "$base_tar" -mtime -7)" ]; then
        echo "the Debian root from $base_tar" >&2
        return 0
    fi
    mkdir -p "$cache" &&
        nice -n 15 debootstrap --variant=minbase --include=python3,python3-venv bookworm "$work/rootfs" \
            http://deb.debian.org/debian &&
        # Without apt's lists and downloaded packages, documentation and message catalogues,
        # as Debian's slim images ship: 265 MiB -> about 130, which each stage of the build
        # and each container run copies (the vfs driver copies whole trees).
        tar -C "$work/rootfs" --exclude='./var/lib/apt/lists/*' --exclude='./var/cache/apt/*' \
            --exclude='./usr/share/doc/*' --exclude='./usr/share/man/*' --exclude='./usr/share/locale/*' \
            --exclude='./usr/share/info/*' -cf "$base_tar.$$" . &&
        mv "$base_tar.$$" "$base_tar" &&
        rm -rf "$work/rootfs"
}
build() {
    debian_root &&
        "${podman[@]}" import - localhost/otel-vgpu-test-base:latest <"$base_tar" &&
        # The sandbox refuses the default rlimits runc asks for (testkit/image_build.py ULIMITS).
        # --layers=false: one working container per stage, no commit per instruction; with
        # the vfs driver each commit copied the whole tree (126 s and 106 s of CPU; 63 s and 65 s).
        "${podman[@]}" build --layers=false --network host --ulimit nofile=1024:1024 --ulimit nproc=1024:1024 \
            -v "$ca_bundle:$ca_bundle:ro" --build-arg BASE_IMAGE=localhost/otel-vgpu-test-base:latest \
            -t "$tag" "$root"
}
if build >"$log" 2>&1; then
    echo "$tag" >"$work/built"
else
    tail -c 4000 "$log" >"$work/failed"
fi
