#!/usr/bin/env bash
# Create .venv and install the host plus every plugin in plugins/ (editable), with test tools.
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
  [ -f "$dir/pyproject.toml" ] && editable+=(-e "$dir")
done
echo "[setup] installing ${editable[*]}" >&2
.venv/bin/python -m pip install -q --disable-pip-version-check "${editable[@]}"
