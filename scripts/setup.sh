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
editable=(-e ".[test]")
for dir in plugins/*/; do
  case "$(basename "$dir")" in _*) continue ;; esac  # plugins/_template is copied, not installed
  [ -f "$dir/pyproject.toml" ] && editable+=(-e "${dir%/}[test]")
done
echo "[setup] installing ${editable[*]}" >&2
.venv/bin/python -m pip install -q --disable-pip-version-check "${editable[@]}"
