#!/usr/bin/env bash
# Create .venv and install the Werk host and its plugins into it, editable.
#
#   bash scripts/setup.sh          everything: the host and every plugin in plugins/, each with its
#                                  test extra (test tools included): what scripts/test.sh uses.
#                                  plugins/_template is a copy-me example and is not installed.
#   bash scripts/setup.sh --serve  serving only: the host and werk-llamacpp, no extras: what
#                                  scripts/serve-demo.sh (README's first command) uses.
#   --dry-run                      print each decision ("up to date", or every step it would run
#                                  and the stamp it would write) and change nothing.
#
# Up-to-date check: a successful set-up writes the stamp .venv/.werk-setup-<serve|full>, a
# SHA-256 over the mode, this checkout's path, .venv/pyvenv.cfg (the interpreter), this script
# and every pyproject.toml involved. When it matches, the set-up prints one line and runs no pip
# and no Python at all: editable installs see source edits without reinstalling, and a changed
# pyproject.toml (dependencies, entry points) or interpreter installs again. A full set-up also
# writes the serving stamp (it installs a superset).
#
# Speed: a new .venv is made --without-pip and the base interpreter's pip installs pip and the
# build backend (the [build-system] requires of the pyproject.toml files) into it, which is
# quicker than venv's bundled pip and setuptools; editable builds then run without build
# isolation (the backend is installed once, not once per package), and nothing is byte-compiled
# ahead of use (Python compiles what it imports, once). Where the base interpreter has no pip new
# enough for `pip --python`, venv's own pip is used.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
mode=full
dry_run=0
for arg in "$@"; do
  case "$arg" in
    --serve) mode=serve ;;
    --dry-run) dry_run=1 ;;
    *)
      echo "[setup] unknown option: $arg (use --serve, --dry-run)" >&2
      exit 2
      ;;
  esac
done
started=$SECONDS
say() { echo "[setup] $*" >&2; }

# What each mode installs: project directories ("." is the host).
serve_dirs=(. plugins/llamacpp)
full_dirs=(.)
for dir in plugins/*/; do
  case "$(basename "$dir")" in _*) continue ;; esac # plugins/_template is copied, not installed
  [ -f "$dir/pyproject.toml" ] || continue
  full_dirs+=("${dir%/}")
done
for dir in integrations/*/; do # the front ends that are Python distributions (werk-comfyui)
  [ -f "$dir/pyproject.toml" ] && full_dirs+=("${dir%/}")
done
if [ "$mode" = serve ]; then dirs=("${serve_dirs[@]}"); else dirs=("${full_dirs[@]}"); fi

dist_name() { sed -n 's/^name *= *"\([^"]*\)".*/\1/p' "$1/pyproject.toml" | head -n 1; }
names=()
for dir in "${dirs[@]}"; do names+=("$(dist_name "$dir")"); done

sha256() { if command -v sha256sum >/dev/null 2>&1; then sha256sum; else shasum -a 256; fi | cut -d' ' -f1; }
stamp_hash() { # MODE DIR... -> the stamp's content for that mode
  local m=$1
  shift
  {
    echo "mode=$m"
    pwd
    cat .venv/pyvenv.cfg 2>/dev/null || true
    cat scripts/setup.sh
    for d in "$@"; do
      echo "== $d/pyproject.toml"
      cat "$d/pyproject.toml"
    done
  } | sha256
}
stamp=.venv/.werk-setup-$mode

if [ -x .venv/bin/python ] && [ -f .venv/pyvenv.cfg ] && [ -f "$stamp" ] &&
  [ "$(cat "$stamp")" = "$(stamp_hash "$mode" "${dirs[@]}")" ]; then
  say ".venv is up to date ($mode: ${names[*]})"
  exit 0
fi

# The build backends the pyproject.toml files name (one-line `requires = [...]` lists).
build_reqs=()
for dir in "${dirs[@]}"; do
  line=$(sed -n '/^\[build-system\]/,/^\[/s/^requires *= *\[\(.*\)\].*/\1/p' "$dir/pyproject.toml")
  IFS=',' read -ra reqs <<<"$line"
  for req in "${reqs[@]}"; do
    req=$(echo "$req" | tr -d "\"' ")
    [ -n "$req" ] || continue
    case " ${build_reqs[*]} " in *" $req "*) ;; *) build_reqs+=("$req") ;; esac
  done
done
install=(install -q --disable-pip-version-check --no-compile)
editable=()
for dir in "${dirs[@]}"; do editable+=(-e "$dir"); done
isolation=(--no-build-isolation)
if [ ${#build_reqs[@]} -eq 0 ]; then isolation=(); fi
extras=()
for name in "${names[@]}"; do extras+=("$name[test]"); done

have_pip() { compgen -G ".venv/lib/python*/site-packages/pip/__init__.py" >/dev/null; }

if [ "$dry_run" = 1 ]; then
  if [ -x .venv/bin/python ]; then
    have_pip || say "would install pip into .venv"
    say "would install the build backend: ${build_reqs[*]}"
  else
    say "would create .venv with $("$PYTHON" --version 2>&1) and install pip ${build_reqs[*]} into it"
  fi
  say "would install ($mode): pip install ${isolation[*]+${isolation[*]} }--no-compile ${editable[*]}"
  [ "$mode" = serve ] || say "would install the test extras: pip install ${extras[*]}"
  if [ -f .venv/pyvenv.cfg ]; then
    say "would write $stamp: $(stamp_hash "$mode" "${dirs[@]}")"
    [ "$mode" = serve ] || say "would write .venv/.werk-setup-serve: $(stamp_hash serve "${serve_dirs[@]}")"
  else
    say "would write $stamp once .venv exists"
  fi
  exit 0
fi

rm -f .venv/.werk-setup-serve .venv/.werk-setup-full # stale from here until this set-up succeeds
backend_done=0
if [ ! -x .venv/bin/python ]; then
  say "creating .venv with $("$PYTHON" --version 2>&1), then pip and ${build_reqs[*]}"
  if { "$PYTHON" -m venv --without-pip .venv &&
    "$PYTHON" -m pip --python .venv/bin/python "${install[@]}" pip ${build_reqs[@]+"${build_reqs[@]}"}; }; then
    backend_done=1
  else
    say "the base interpreter's pip cannot install into .venv; using venv's bundled pip"
    rm -rf .venv
    "$PYTHON" -m venv .venv
  fi
fi
if ! have_pip; then
  say "installing pip into .venv"
  .venv/bin/python -m ensurepip -q
fi
if [ "$backend_done" = 0 ] && [ ${#build_reqs[@]} -gt 0 ]; then
  say "installing the build backend: ${build_reqs[*]}"
  .venv/bin/python -m pip "${install[@]}" "${build_reqs[@]}"
fi
say "installing ${names[*]} (editable$([ "$mode" = serve ] && echo ', serving only, no extras'))"
.venv/bin/python -m pip "${install[@]}" ${isolation[@]+"${isolation[@]}"} "${editable[@]}"
if [ "$mode" = full ]; then
  # A second pass, by name: some test extras name another plugin of this tree (werk-candle-bridge's
  # tests use werk-llamacpp's model generator) that is on no index, so it must already be
  # installed when pip resolves them; the editable installs above satisfy them as they are.
  say "installing the test extras: ${extras[*]}"
  .venv/bin/python -m pip "${install[@]}" "${extras[@]}"
  stamp_hash serve "${serve_dirs[@]}" >.venv/.werk-setup-serve
fi
stamp_hash "$mode" "${dirs[@]}" >"$stamp"
say "done in $((SECONDS - started)) s ($mode: ${names[*]}); a re-run with no pyproject.toml change does nothing"
