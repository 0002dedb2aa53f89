#!/usr/bin/env bash
# Builds the container image the tests run (tests/system/test_image.py) into its own podman
# storage under WORK: a Debian root from debootstrap (kept per machine for a week)
# imported as the base, then the Dockerfile's two stages, with their packages from a
# package index served here over HTTPS by a CA of its own (`index`). Leaves WORK/built
# (the tag) or WORK/failed (the log's tail).
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
# The package index the build installs from, as a user's mirror or proxy of PyPI would be:
# the wheels the Dockerfile's pip asks for (the project's dependencies, pinned as it pins
# them, and its build backend), for the base's Python (Debian bookworm's 3.11), fetched by
# this machine's pip, and served on the loopback over HTTPS with a certificate of a CA made
# for this build. The build reaches it only through the Dockerfile's PIP_INDEX_URL and
# trusts it only through its `ca` secret, so a build that passes shows both work.
index=$work/index
index_pid=""
index_certs() {
    local dir=$index/tls
    mkdir -p "$dir" &&
        openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=otel-vgpu test index CA" \
            -keyout "$dir/ca.key" -out "$dir/ca.pem" 2>/dev/null &&
        openssl req -newkey rsa:2048 -nodes -subj "/CN=127.0.0.1" -keyout "$dir/key.pem" -out "$dir/req.csr" \
            2>/dev/null &&
        printf 'subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' \
            >"$dir/ext.cnf" &&
        openssl x509 -req -in "$dir/req.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca.key" -CAcreateserial -days 2 \
            -extfile "$dir/ext.cnf" -out "$dir/cert.pem" 2>/dev/null
}
index_wheels() {
    local backend
    # The build backend's requirements, from pyproject.toml.
    mapfile -t backend < <(python3 -c 'import sys, tomllib
print(*tomllib.load(open(sys.argv[1], "rb"))["build-system"]["requires"], sep="\n")' "$root/pyproject.toml")
    [ "${#backend[@]}" -gt 0 ] &&
        # pip from a virtual environment of its own: on a fresh machine scripts/test.sh
        # starts this build before it makes .venv.
        python3 -m venv "$index/pip" &&
        "$index/pip/bin/python" -m pip download --quiet --disable-pip-version-check \
            -c "$root/constraints.txt" --python-version 3.11 --only-binary=:all: -d "$index/files" \
            "$root" "${backend[@]}"
}
serve_index() {
    index_certs && index_wheels || return 1
    # PEP 503: a page per project, linking its files; the server's log of each request goes
    # to the build's log.
    python3 - "$index" <<'EOF' &
import functools, http.server, re, ssl, sys
from pathlib import Path

index = Path(sys.argv[1])
for wheel in sorted((index / "files").glob("*.whl")):
    project = index / "simple" / re.sub(r"[-_.]+", "-", wheel.name.split("-")[0]).lower()
    project.mkdir(parents=True, exist_ok=True)
    (project / wheel.name).symlink_to(wheel)
    with open(project / "index.html", "a") as page:
        page.write(f'<a href="{wheel.name}">{wheel.name}</a>\n')
handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(index))
server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain(index / "tls" / "cert.pem", index / "tls" / "key.pem")
server.socket = context.wrap_socket(server.socket, server_side=True)
(index / "url.new").write_text(f"https://127.0.0.1:{server.server_address[1]}/simple\n")
(index / "url.new").rename(index / "url")
server.serve_forever()
EOF
    index_pid=$!
    for _ in $(seq 600); do
        [ -s "$index/url" ] && return 0
        kill -0 "$index_pid" 2>/dev/null || return 1
        sleep 0.1
    done
    return 1
}
stop_index() {
    [ -z "$index_pid" ] || kill "$index_pid" 2>/dev/null
}
trap stop_index EXIT
build() {
    debian_root &&
        serve_index &&
        "${podman[@]}" import - localhost/otel-vgpu-test-base:latest <"$base_tar" &&
        # The sandbox refuses the default rlimits runc asks for (testkit/image_build.py ULIMITS).
        # --layers=false: one working container per stage, no commit per instruction; with
        # the vfs driver each commit copied the whole tree (126 s and 106 s of CPU; 63 s and 65 s).
        # --network host: the index is on this machine's loopback.
        "${podman[@]}" build --layers=false --network host --ulimit nofile=1024:1024 --ulimit nproc=1024:1024 \
            --build-arg BASE_IMAGE=localhost/otel-vgpu-test-base:latest \
            --build-arg "PIP_INDEX_URL=$(cat "$index/url")" --secret "id=ca,src=$index/tls/ca.pem" \
            -t "$tag" "$root"
}
if build >"$log" 2>&1; then
    echo "$tag" >"$work/built"
else
    tail -c 4000 "$log" >"$work/failed"
fi
