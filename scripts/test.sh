#!/usr/bin/env bash
# Set everything up (venv, plugins, a cached llama-server build), check lint, format and types,
# then run the host's tests and every plugin's own suite from its own directory (so a plugin's
# tests prove they need nothing from the host repository's tests/). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/setup-browser.sh # chromium for tests/test_ui.py (docs/ui.md)
if [ -z "${WERK_LLAMA_SERVER:-}" ] && [ -f scripts/build-llama-server.sh ]; then
  WERK_LLAMA_SERVER=$(bash scripts/build-llama-server.sh | tail -n 1)
  export WERK_LLAMA_SERVER
fi
if [ -z "${WERK_VLLM:-}" ] && [ -f scripts/setup-vllm.sh ]; then
  WERK_VLLM=$(bash scripts/setup-vllm.sh | tail -n 1)
fi
if [ -n "${WERK_VLLM:-}" ]; then export WERK_VLLM; fi
# The transformers and ONNX GenAI engine virtualenvs (cached; docs/transformers.md, docs/onnx-genai.md).
if [ -z "${WERK_TRANSFORMERS_PYTHON:-}" ] && [ -f scripts/setup-engine-venv.sh ]; then
  WERK_TRANSFORMERS_PYTHON=$(bash scripts/setup-engine-venv.sh transformers | tail -n 1)
fi
if [ -n "${WERK_TRANSFORMERS_PYTHON:-}" ]; then export WERK_TRANSFORMERS_PYTHON; fi
# The diffusers engine shares the transformers virtualenv (docs/diffusers.md, "The venv").
if [ -z "${WERK_DIFFUSERS_PYTHON:-}" ] && [ -f scripts/setup-engine-venv.sh ]; then
  WERK_DIFFUSERS_PYTHON=$(bash scripts/setup-engine-venv.sh diffusers | tail -n 1)
fi
if [ -n "${WERK_DIFFUSERS_PYTHON:-}" ]; then export WERK_DIFFUSERS_PYTHON; fi
if [ -z "${WERK_ONNX_GENAI_PYTHON:-}" ] && [ -f scripts/setup-engine-venv.sh ]; then
  WERK_ONNX_GENAI_PYTHON=$(bash scripts/setup-engine-venv.sh onnx-genai | tail -n 1)
fi
if [ -n "${WERK_ONNX_GENAI_PYTHON:-}" ]; then export WERK_ONNX_GENAI_PYTHON; fi
# The Qwen3-TTS engine virtualenv (cached; docs/media.md, "Speech").
if [ -z "${WERK_QWEN_TTS_PYTHON:-}" ] && [ -f scripts/setup-engine-venv.sh ]; then
  WERK_QWEN_TTS_PYTHON=$(bash scripts/setup-engine-venv.sh qwen-tts | tail -n 1)
fi
if [ -n "${WERK_QWEN_TTS_PYTHON:-}" ]; then export WERK_QWEN_TTS_PYTHON; fi
plugin_sources=()
for init in plugins/*/src/*/__init__.py; do
  plugin_sources+=("$(dirname "$init")")
done
echo "[test] ruff check, ruff format --check, mypy --strict werk_host ${plugin_sources[*]}" >&2
.venv/bin/ruff check --no-cache werk_host plugins integrations tests bench
.venv/bin/ruff format --check --no-cache werk_host plugins integrations tests bench
.venv/bin/mypy --strict werk_host "${plugin_sources[@]}"
# werk-comfyui's folder is itself ComfyUI's module (its __init__.py), so its package is named.
MYPYPATH=integrations/comfyui .venv/bin/mypy --strict -p werk_comfyui
status=0
echo "[test] host: pytest tests" >&2
.venv/bin/python -m pytest tests "$@" || status=$?
for dir in plugins/*/; do
  [ -d "$dir/tests" ] || continue
  echo "[test] plugin: cd $dir && pytest" >&2
  (cd "$dir" && ../../.venv/bin/python -m pytest "$@") || status=$?
done
# n8n-nodes-werk: its own build, lint and unit tests, then real n8n (scripts/setup-n8n.sh,
# cached) running workflows through werk serve (docs/n8n.md, "Tests").
if [ -f integrations/n8n/package.json ]; then
  if command -v npm >/dev/null 2>&1; then
    echo "[test] integration: cd integrations/n8n && npm ci && npm run build && npm run lint && npm test" >&2
    (cd integrations/n8n && npm ci --no-audit --no-fund --loglevel=error && npm run build && npm run lint && npm test) ||
      status=$?
    echo "[test] integration: cd integrations/n8n/e2e && pytest" >&2
    (cd integrations/n8n/e2e && ../../../.venv/bin/python -m pytest "$@") || status=$?
  else
    echo "[test] npm not found: integrations/n8n is not built or tested" >&2
  fi
fi
for dir in integrations/*/; do
  [ -f "$dir/pyproject.toml" ] && [ -d "$dir/tests" ] || continue
  echo "[test] integration: cd $dir && pytest" >&2
  (cd "$dir" && ../../.venv/bin/python -m pytest "$@") || status=$?
done
exit "$status"
