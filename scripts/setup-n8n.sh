#!/usr/bin/env bash
# Install (once) the real n8n the n8n end-to-end test (integrations/n8n/e2e) runs its workflows in,
# from the npm registry, pinned, cached by version under ${XDG_CACHE_HOME:-~/.cache}/werk/n8n/<version>/.
#
# n8n 2.x needs Node 24; the 1.x line (engines ">=20.19 <=24.x") is the one that runs on Node 20,
# so the pin is on 1.x. Version: N8N_VERSION.
#
# Output: progress on stderr; the LAST line on stdout is the `n8n` executable. A second run finds
# the cache and only prints it. Exit 3 when npm is missing (the e2e test skips with that reason).
set -euo pipefail

N8N_VERSION="${N8N_VERSION:-1.123.81}"
XLSX_VERSION="${XLSX_VERSION:-0.18.5}"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/werk/n8n"
root="$cache/$N8N_VERSION"

if [[ ! -f "$root/.installed" ]]; then
    if ! command -v npm >/dev/null 2>&1; then
        echo "[n8n] npm not found: install Node.js and npm to run the n8n end-to-end test" >&2
        exit 3
    fi
    echo "[n8n] installing n8n@$N8N_VERSION into $root (once; large, several minutes)" >&2
    mkdir -p "$cache"
    tmp="$(mktemp -d "$cache/.install.XXXXXX")"
    trap 'rm -rf "$tmp"' EXIT
    started=$SECONDS
    # n8n-nodes-base asks for xlsx as a tarball from cdn.sheetjs.com, outside the npm registry
    # (unreachable where only the registry is): the override takes the registry's last xlsx.
    cat >"$tmp/package.json" <<JSON
{"name": "werk-n8n", "private": true, "dependencies": {"n8n": "$N8N_VERSION"},
 "overrides": {"xlsx": "$XLSX_VERSION"}}
JSON
    # No install scripts: isolated-vm 6.2 (for @n8n/expression-runtime, not used by `n8n execute`)
    # needs Node 22 headers and does not build on Node 20. The one native module n8n needs here,
    # sqlite3 (its default database), is then built on its own (prebuilt binary when the GitHub
    # download works, else compiled from source: a few minutes).
    npm install --prefix "$tmp" --no-audit --no-fund --loglevel=error --ignore-scripts >&2
    echo "[n8n] building sqlite3" >&2
    npm rebuild --prefix "$tmp" --no-audit --no-fund --loglevel=error sqlite3 >&2
    echo "[n8n] n8n --version: $("$tmp/node_modules/.bin/n8n" --version 2>/dev/null | tail -1)" >&2
    rm -rf "$root"
    mv "$tmp" "$root"
    trap - EXIT
    touch "$root/.installed"
    echo "[n8n] installed in $((SECONDS - started)) s ($(du -sh "$root" 2>/dev/null | cut -f1))" >&2
fi
echo "$root/node_modules/.bin/n8n"
