#!/usr/bin/env bash
# Set everything up and serve a generated tiny GGUF model on the llama.cpp backend.
#   WERK_HOME (default ~/.werk), WERK_PORT (default 11434) and extra `werk serve` flags
#   (e.g. --api-key KEY, --persistence) are honoured.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
WERK_LLAMA_SERVER=${WERK_LLAMA_SERVER:-$(bash scripts/build-llama-server.sh | tail -n 1)}
export WERK_LLAMA_SERVER
home=${WERK_HOME:-$HOME/.werk}
model="$home/demo/werk-demo-tiny.gguf"
if [ ! -f "$model" ]; then
  mkdir -p "$home/demo"
  .venv/bin/python -m werk_llamacpp.testmodel "$model" >&2
fi
.venv/bin/werk models add demo "$model" --backend llama.cpp --param max_output_tokens=512 --home "$home" >/dev/null
echo "[serve-demo] serving model 'demo' (random weights: output is nonsense by design)" >&2
exec .venv/bin/werk serve --home "$home" --model demo --port "${WERK_PORT:-11434}" "$@"
