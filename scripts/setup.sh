#!/usr/bin/env bash
# Create .venv and install the host plus every plugin in plugins/ (editable, with its test extra),
# with test tools. plugins/_template is a copy-me example: its tests run from its own directory.
# Idempotent: re-running only installs what changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv with $($PYTHON --version)" >&2
  "$PYTHON" -m venv .venv
fi
plain=(-e .)
editable=(-e ".[test]")
for dir in plugins/*/; do
  case "$(basename "$dir")" in _*) continue ;; esac  # plugins/_template is copied, not installed
  [ -f "$dir/pyproject.toml" ] || continue
  plain+=(-e "${dir%/}")
  editable+=(-e "${dir%/}[test]")
done
# Two passes: the plugins themselves first, then their test extras, some of which name another
# plugin of this tree (werk-candle-bridge's tests use werk-llamacpp's model generator) that is
# on no index, so it must already be installed when pip resolves them.
echo "[setup] installing ${plain[*]}" >&2
.venv/bin/python -m pip install -q --disable-pip-version-check "${plain[@]}"
echo "[setup] installing test extras: ${editable[*]}" >&2
.venv/bin/python -m pip install -q --disable-pip-version-check "${editable[@]}"
