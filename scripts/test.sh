#!/usr/bin/env bash
# Set everything up (venv, plugins, a cached llama-server build) and run the whole test suite.
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ -z "${WERK_LLAMA_SERVER:-}" ] && [ -f scripts/build-llama-server.sh ]; then
  WERK_LLAMA_SERVER=$(bash scripts/build-llama-server.sh | tail -n 1)
  export WERK_LLAMA_SERVER
fi
exec .venv/bin/python -m pytest "$@"
