#!/usr/bin/env bash
# Installs everything the tests need on a fresh Debian machine, then runs them
# all: lint, format, types, unit, integration and end-to-end tests.
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian's prometheus package: the server scrapes the agent in the end-to-end
# tests, promtool checks the exposition format and the alert rules.
if ! command -v promtool >/dev/null 2>&1 || ! command -v prometheus >/dev/null 2>&1; then
    echo "installing Debian's prometheus package..."
    sudo_cmd=""
    [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
    $sudo_cmd apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi

python3 -m venv .venv
.venv/bin/python -m pip install -q -c constraints.txt -e '.[test]'

.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
.venv/bin/pytest "$@"
