#!/usr/bin/env bash
# Install (once) the real coding agents the agent smoke tests run against `werk serve`:
# Claude Code (@anthropic-ai/claude-code) and Codex CLI (@openai/codex), from the npm registry,
# pinned, cached by version under ${XDG_CACHE_HOME:-~/.cache}/werk/agents/<versions>/.
#
# Output: progress on stderr; the LAST two lines on stdout are the `claude` and `codex`
# executables. A second run finds the cache and only prints them. Exit 3 when npm is missing
# (the tests skip with that reason). Versions: CLAUDE_CODE_VERSION, CODEX_VERSION.
set -euo pipefail

CLAUDE_CODE_VERSION="${CLAUDE_CODE_VERSION:-2.1.332}"
CODEX_VERSION="${CODEX_VERSION:-0.171.0}"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/werk/agents"
root="$cache/claude-code-$CLAUDE_CODE_VERSION-codex-$CODEX_VERSION"

if [[ ! -f "$root/.installed" ]]; then
    if ! command -v npm >/dev/null 2>&1; then
        echo "[agents] npm not found: install Node.js and npm to run the agent smoke tests" >&2
        exit 3
    fi
    echo "[agents] installing @anthropic-ai/claude-code@$CLAUDE_CODE_VERSION and @openai/codex@$CODEX_VERSION into $root (once, ~800 MB)" >&2
    mkdir -p "$cache"
    tmp="$(mktemp -d "$cache/.install.XXXXXX")"
    trap 'rm -rf "$tmp"' EXIT
    started=$SECONDS
    npm install --prefix "$tmp" --no-audit --no-fund --no-save --loglevel=error \
        "@anthropic-ai/claude-code@$CLAUDE_CODE_VERSION" "@openai/codex@$CODEX_VERSION" >&2
    for tool in claude codex; do
        "$tmp/node_modules/.bin/$tool" --version >&2
    done
    rm -rf "$root"
    mv "$tmp" "$root"
    trap - EXIT
    touch "$root/.installed"
    echo "[agents] installed in $((SECONDS - started)) s" >&2
fi
echo "$root/node_modules/.bin/claude"
echo "$root/node_modules/.bin/codex"
