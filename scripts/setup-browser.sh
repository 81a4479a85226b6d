#!/usr/bin/env bash
# The browser tests/test_ui.py drives: Debian's `chromium` and `chromium-driver` (apt), never a
# browser build downloaded by a test tool (docs/ui.md, "Tests"). Idempotent; prints one line:
#
#   present      both commands are on PATH: nothing to do (no apt, no network)
#   installed    missing, and installed now with apt-get (as root, or with password-less sudo)
#   cannot       missing, and no apt-get or no root: nothing changes, the status is still 0,
#                and the browser tests skip with that reason
#
# scripts/test.sh runs it after scripts/setup.sh.
set -uo pipefail
say() { echo "[browser] $*" >&2; }
have() { command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; }
if have; then
  say "chromium and chromedriver are present"
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  say "cannot install chromium and chromium-driver: no apt-get here; the browser tests will skip"
  exit 0
fi
sudo=()
if [ "$(id -u)" != 0 ]; then
  if command -v sudo >/dev/null 2>&1 && sudo -n true >/dev/null 2>&1; then
    sudo=(sudo -n)
  else
    say "cannot install chromium and chromium-driver: not root (and no password-less sudo); the browser tests will skip"
    exit 0
  fi
fi
export DEBIAN_FRONTEND=noninteractive
if "${sudo[@]}" apt-get update -qq >/dev/null 2>&1 &&
  "${sudo[@]}" apt-get install -y -qq chromium chromium-driver >/dev/null 2>&1 && have; then
  say "installed chromium and chromium-driver with apt-get"
else
  say "cannot install chromium and chromium-driver: apt-get failed; the browser tests will skip"
fi
exit 0
