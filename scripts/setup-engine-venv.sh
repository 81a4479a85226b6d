#!/usr/bin/env bash
# Install (once) and cache the Python engine virtualenv of a Werk worker plugin:
#
#   bash scripts/setup-engine-venv.sh transformers   # werk-transformers (docs/transformers.md)
#   bash scripts/setup-engine-venv.sh diffusers      # werk-diffusers (docs/diffusers.md)
#   bash scripts/setup-engine-venv.sh onnx-genai     # werk-onnx-genai (docs/onnx-genai.md)
#   bash scripts/setup-engine-venv.sh qwen-tts       # werk-qwen-tts (Qwen3-TTS speech)
#
# Packages (pinned below; the cache directory is keyed by them):
#   transformers, diffusers  ONE shared venv (cache name torch-cpu): torch (CPU build),
#                 transformers, tokenizers, safetensors, diffusers, pillow, scipy (LMS)
#   onnx-genai    onnxruntime-genai, and for its model builder (tests, benches) onnx, onnx-ir,
#                 torch (CPU build), transformers
#   qwen-tts      qwen-tts (the Qwen3-TTS inference package) installed --no-deps, beside torch (CPU
#                 build), transformers 4.57.3 (qwen-tts pins it exactly) and the libraries its
#                 modules import at the top: librosa, soundfile, sox, onnxruntime, einops. Its other
#                 declared requirements are left out: gradio (its demo only), accelerate (only for
#                 device_map loading, which the worker does not use) and torchaudio (PyPI has no
#                 build for this torch; qwen_tts imports only torchaudio.compliance.kaldi, for the
#                 25 Hz tokenizer's x-vector extractor, which the worker stands in for).
# torch is pinned to the CPU build `torch==<x>+cpu`: PyPI's default Linux wheel pulls several GB
# of CUDA libraries. PyPI does not host the +cpu builds; pip finds one in a local wheel directory
# (pip's find-links, as on the CI machines) or, without one, set
# WERK_ENGINE_PIP_ARGS="--extra-index-url https://download.pytorch.org/whl/cpu".
#
# Cache:  ${XDG_CACHE_HOME:-$HOME/.cache}/werk/<cache name>/<version>/venv, <version> being the pins'
#         short hash; <version>/complete is written last and marks a finished install, so a
#         second run prints the path and exits at once. A venv without the marker (an
#         interrupted run) is removed and rebuilt. Concurrent runs serialise on <version>.lock.
# Output: progress on stderr, prefixed [setup-<engine>]; the LAST stdout line is the venv's
#         python, so `WERK_TRANSFORMERS_PYTHON=$(bash scripts/setup-engine-venv.sh transformers |
#         tail -n1)` works. Exit 0 with nothing on stdout (reason on stderr) means "skipped: this
#         platform cannot run the engine". Any other failure exits non-zero.
# Knobs:  WERK_ENGINE_PYTHON (interpreter that creates the venv, default python3),
#         WERK_ENGINE_PIP_ARGS (extra pip install arguments, word-split).
set -euo pipefail

ENGINE="${1:-}"
TORCH="torch==2.13.0+cpu"
TRANSFORMERS="transformers==5.24.0"
# CACHE_NAME: the cache directory's name; engines with the same packages share one venv.
case "$ENGINE" in
  transformers | diffusers)
    PACKAGES=("$TORCH" "$TRANSFORMERS" "tokenizers==0.23.3" "safetensors==0.8.0" "diffusers==0.42.1" "pillow==13.0.0" "scipy==1.17.1")
    CACHE_NAME=torch-cpu
    ;;
  onnx-genai)
    PACKAGES=("onnxruntime-genai==0.18.0" "onnx==1.23.2" "onnx-ir==1.1.0" "$TORCH" "$TRANSFORMERS")
    CACHE_NAME=onnx-genai
    ;;
  qwen-tts)
    # QWEN_TTS goes in a second pip call, --no-deps (the header); the rest satisfy its imports.
    QWEN_TTS="qwen-tts==0.1.1"
    PACKAGES=("$TORCH" "transformers==4.57.3" "librosa==0.11.0" "soundfile==0.14.0" "sox==1.5.0" "onnxruntime==1.32.0" "einops==0.8.2" "$QWEN_TTS")
    CACHE_NAME=qwen-tts
    ;;
  *)
    echo "usage: $0 transformers|diffusers|onnx-genai|qwen-tts" >&2
    exit 2
    ;;
esac
PY="${WERK_ENGINE_PYTHON:-python3}"
log() { printf '[setup-%s] %s\n' "$ENGINE" "$*" >&2; }

VERSION="$(printf '%s\n' "${PACKAGES[@]}" | sha256sum | cut -c1-12)"
CACHE_ROOT="${XDG_CACHE_HOME:-$HOME/.cache}/werk/$CACHE_NAME"
DEST_DIR="$CACHE_ROOT/$VERSION"
VENV="$DEST_DIR/venv"
MARKER="$DEST_DIR/complete"
VPY="$VENV/bin/python"

if [[ -f "$MARKER" && -x "$VPY" ]]; then
  log "cached: $VPY"
  printf '%s\n' "$VPY"
  exit 0
fi

os="$(uname -s)"
arch="$(uname -m)"
if [[ "$os" != Linux || "$arch" != x86_64 ]]; then
  log "skipped: the pinned CPU wheels are set up for Linux x86_64 only (this is $os $arch)"
  exit 0
fi
if ! command -v "$PY" >/dev/null 2>&1; then
  log "skipped: no Python interpreter '$PY' (set WERK_ENGINE_PYTHON)"
  exit 0
fi
if ! "$PY" -c 'import sys; sys.exit(0 if (3, 11) <= sys.version_info[:2] < (3, 14) else 1)'; then
  log "skipped: the pinned wheels need Python 3.11-3.13; $PY is $("$PY" -V 2>&1) (set WERK_ENGINE_PYTHON)"
  exit 0
fi

mkdir -p "$CACHE_ROOT"
exec 9>"$CACHE_ROOT/$VERSION.lock"
if ! flock -n 9; then
  log "another run holds $CACHE_ROOT/$VERSION.lock; waiting"
  flock 9
fi
if [[ -f "$MARKER" && -x "$VPY" ]]; then
  log "cached: $VPY"
  printf '%s\n' "$VPY"
  exit 0
fi

BUILDING=0
cleanup() {
  local rc=$?
  if ((BUILDING)) && [[ ! -f "$MARKER" ]]; then
    log "failed (exit $rc): removing the incomplete venv $VENV"
    rm -rf "$VENV"
  fi
}
trap cleanup EXIT

started=$SECONDS
if [[ -e "$VENV" ]]; then
  log "removing the incomplete venv $VENV (no completion marker)"
  rm -rf "$VENV"
fi
BUILDING=1
mkdir -p "$DEST_DIR"
log "creating $VENV with $("$PY" -V 2>&1)"
"$PY" -m venv "$VENV" >&2
read -r -a extra <<<"${WERK_ENGINE_PIP_ARGS:-}"
install=("${PACKAGES[@]}")
nodeps=()
if [[ "$ENGINE" == qwen-tts ]]; then
  install=("${PACKAGES[@]:0:${#PACKAGES[@]}-1}")
  nodeps=("$QWEN_TTS")
fi
log "pip install ${extra[*]:+${extra[*]} }${install[*]} (about a minute on a warm pip cache)"
if ! "$VPY" -m pip install --disable-pip-version-check --progress-bar off "${extra[@]}" "${install[@]}" >&2; then
  log "pip install failed. PyPI does not host $TORCH; without a local wheel set"
  log "  WERK_ENGINE_PIP_ARGS='--extra-index-url https://download.pytorch.org/whl/cpu'"
  exit 1
fi
if ((${#nodeps[@]})); then
  log "pip install --no-deps ${nodeps[*]}"
  "$VPY" -m pip install --disable-pip-version-check --progress-bar off --no-deps "${extra[@]}" "${nodeps[@]}" >&2
fi
case "$ENGINE" in
  transformers) probe='import torch, transformers, tokenizers, safetensors' ;;
  diffusers) probe='import torch, diffusers, PIL, scipy' ;;
  onnx-genai) probe='import onnxruntime_genai, onnx, onnx_ir, torch, transformers' ;;
  # torchaudio is not installed: like the worker (plugins/qwen_tts/src/werk_qwen_tts/worker.py,
  # import_qwen_tts), the probe stands in for the one torchaudio module qwen_tts imports, while
  # it imports, after transformers (which must see no torchaudio).
  qwen-tts)
    stub='("torchaudio", "torchaudio.compliance", "torchaudio.compliance.kaldi")'
    probe="import sys, types, torch, transformers, soundfile; sys.modules.update((n, types.ModuleType(n)) for n in $stub)"
    probe+="; import qwen_tts; [sys.modules.pop(n) for n in $stub]"
    ;;
esac
log "verifying: python -c '$probe'"
"$VPY" -c "$probe" >&2 # stdout carries only the venv's python
{
  printf '%s\n' "${PACKAGES[@]}"
  printf 'python %s\ncreated %s\n' "$("$VPY" -c 'import sys; print(sys.version.split()[0])')" "$(date -u +%FT%TZ)"
} >"$DEST_DIR/.complete.$$"
mv -f "$DEST_DIR/.complete.$$" "$MARKER"
BUILDING=0
log "installed in $((SECONDS - started)) s ($(du -sh "$VENV" 2>/dev/null | cut -f1)): $VPY"
printf '%s\n' "$VPY"
