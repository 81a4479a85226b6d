"""Finding the ``vllm`` executable and learning which ``vllm serve`` flags it has.

Discovery (:func:`find_vllm`): the ``executable`` backend option, else ``WERK_VLLM``, else
``vllm`` on ``PATH``. An explicit option or a set ``WERK_VLLM`` that is not an executable file is
an error; discovery never falls through to another executable.

Flags (:func:`inspect_vllm`): ``vllm serve --help=all`` (and ``vllm --version``) take about ten
seconds, so their parsed result is cached in memory and on disk
(``WERK_HOME/backends/vllm/flags/<key>.json``), keyed by the executable's resolved path, size and
modification time: a replaced or upgraded executable is inspected again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import subprocess
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from werk_host.plugin import PrivateDirError, ensure_private_dir
from werk_host.plugin.process import find_executable

__all__ = [
    "ENV_VAR",
    "ExecutableIdentity",
    "InspectionError",
    "ServeHelp",
    "VllmNotFound",
    "find_vllm",
    "flag_name",
    "inspect_vllm",
    "parse_serve_help",
]

ENV_VAR = "WERK_VLLM"
EXECUTABLE_NAME = "vllm"
HELP_TIMEOUT_S = 180.0
CACHE_FORMAT = 1
_FLAG = re.compile(r"--?[A-Za-z][A-Za-z0-9_.\-]*")


class VllmNotFound(FileNotFoundError):
    """No usable vllm executable (the message may name paths: log it, never answer it)."""


class InspectionError(RuntimeError):
    """``vllm serve --help=all`` could not be run or parsed (the message may name paths)."""


def find_vllm(explicit: str | None = None, *, env: Mapping[str, str] | None = None) -> Path:
    """The vllm executable (see the module docstring) as an absolute path."""
    found = find_executable(EXECUTABLE_NAME, explicit=explicit, env_var=ENV_VAR, error=VllmNotFound, env=env)
    if found is None:
        raise VllmNotFound(f"no vllm executable: set the executable option or {ENV_VAR}, or put vllm on PATH")
    return found


@dataclass(frozen=True)
class ExecutableIdentity:
    """The resolved path, size and modification time of an executable: the flag cache key."""

    path: Path
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, path: str | os.PathLike[str]) -> ExecutableIdentity:
        real = Path(path).resolve(strict=True)
        st = real.stat()
        return cls(real, st.st_size, st.st_mtime_ns)

    @property
    def key(self) -> str:
        raw = f"{self.path}\0{self.size}\0{self.mtime_ns}".encode()
        return hashlib.sha256(raw).hexdigest()[:32]


def flag_name(arg: str) -> str | None:
    """The option name an argument uses, as vLLM's parser reads it (``--max_model_len=8`` is
    ``--max-model-len``), or ``None`` for a value (``-1``, ``0.5``, a path)."""
    if not arg.startswith("-") or arg in ("-", "--"):
        return None
    name = arg.split("=", 1)[0]
    if not _FLAG.fullmatch(name):
        return None
    if name.startswith("--"):
        name = "--" + name[2:].replace("_", "-")
    return name


def parse_serve_help(help_text: str) -> frozenset[str]:
    """Every option ``vllm serve --help=all`` lists.

    argparse prints each option at an indent of two spaces (``  --port PORT``,
    ``  --enable-prefix-caching, --no-enable-prefix-caching``,
    ``  --api-server-count API_SERVER_COUNT, -asc API_SERVER_COUNT``); its description starts
    after a run of two or more spaces or on the next, deeper indented line.
    """
    flags: set[str] = set()
    for line in help_text.splitlines():
        if not line.startswith("  -") or line.startswith("   "):
            continue
        spec = re.split(r"\s{2,}", line.strip(), maxsplit=1)[0]
        for part in spec.split(", "):
            token = part.split(" ", 1)[0]
            if _FLAG.fullmatch(token):
                flags.add(token)
    return frozenset(flags)


@dataclass(frozen=True)
class ServeHelp:
    """What one vllm executable offers: its version and the options ``vllm serve`` accepts."""

    identity: ExecutableIdentity
    version: str
    flags: frozenset[str]

    def missing(self, args: Iterable[str]) -> list[str]:
        """The option names in ``args`` this vllm does not list (in order, without repeats)."""
        out: list[str] = []
        for arg in args:
            name = flag_name(arg)
            if name is not None and name not in self.flags and name not in out:
                out.append(name)
        return out


_MEMORY: dict[ExecutableIdentity, ServeHelp] = {}
_MEMORY_LOCK = threading.Lock()


def clear_memory_cache() -> None:
    with _MEMORY_LOCK:
        _MEMORY.clear()


def _inspection_env() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "NO_COLOR": "1"}


def _run_inspection(identity: ExecutableIdentity, timeout: float) -> ServeHelp:
    exe = str(identity.path)
    env = _inspection_env()
    try:
        # Both take seconds (vLLM imports torch): run them side by side.
        help_proc = subprocess.Popen(
            [exe, "serve", "--help=all"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
        )
    except OSError as err:
        raise InspectionError(f"cannot run {exe}: {err}") from err
    try:
        version_proc = subprocess.Popen(
            [exe, "--version"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env
        )
    except OSError as err:
        help_proc.kill()
        help_proc.wait()
        raise InspectionError(f"cannot run {exe}: {err}") from err
    try:
        help_out, _ = help_proc.communicate(timeout=timeout)
        version_out, _ = version_proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired as err:
        for proc in (help_proc, version_proc):
            proc.kill()
            proc.wait()
        raise InspectionError(f"{exe} serve --help=all did not finish within {timeout:g}s") from err
    text = help_out.decode("utf-8", errors="replace")
    flags = parse_serve_help(text)
    if help_proc.returncode != 0 or "--port" not in flags:
        tail = "\n".join(text.splitlines()[-10:])
        raise InspectionError(f"{exe} serve --help=all failed (exit {help_proc.returncode}):\n{tail}")
    lines = [ln.strip() for ln in version_out.decode("utf-8", errors="replace").splitlines() if ln.strip()]
    version = lines[-1] if version_proc.returncode == 0 and lines else ""
    return ServeHelp(identity, version, flags)


def _read_disk(path: Path, identity: ExecutableIdentity) -> ServeHelp | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "r", encoding="utf-8") as handle:
            raw = json.load(handle)
        if (
            raw.get("format") != CACHE_FORMAT
            or raw.get("path") != str(identity.path)
            or raw.get("size") != identity.size
            or raw.get("mtime_ns") != identity.mtime_ns
        ):
            return None
        flags = raw["flags"]
        version = raw["version"]
        if not isinstance(flags, list) or not all(isinstance(f, str) for f in flags) or not isinstance(version, str):
            return None
        return ServeHelp(identity, version, frozenset(flags))
    except (OSError, ValueError, KeyError, AttributeError):
        return None


def _write_disk(path: Path, found: ServeHelp) -> None:
    doc = {
        "format": CACHE_FORMAT,
        "path": str(found.identity.path),
        "size": found.identity.size,
        "mtime_ns": found.identity.mtime_ns,
        "version": found.version,
        "flags": sorted(found.flags),
    }
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(doc, handle)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()


def inspect_vllm(
    executable: str | os.PathLike[str], cache_dir: Path | None = None, *, timeout: float = HELP_TIMEOUT_S
) -> ServeHelp:
    """The version and ``vllm serve`` options of ``executable`` (cached; see the module docstring).

    Raises :class:`InspectionError` when the help cannot be run or lists no ``--port``, or the
    executable changes while it is inspected."""
    try:
        identity = ExecutableIdentity.of(executable)
    except OSError as err:
        raise InspectionError(f"cannot stat {executable}: {err}") from err
    with _MEMORY_LOCK:
        cached = _MEMORY.get(identity)
    if cached is not None:
        return cached
    disk = cache_dir / f"{identity.key}.json" if cache_dir is not None else None
    found = _read_disk(disk, identity) if disk is not None else None
    if found is None:
        found = _run_inspection(identity, timeout)
        if ExecutableIdentity.of(identity.path) != identity:
            raise InspectionError(f"{identity.path} changed while it was inspected")
        if disk is not None and cache_dir is not None:
            try:
                ensure_private_dir(cache_dir)
            except (OSError, PrivateDirError):
                pass
            else:
                _write_disk(disk, found)
    with _MEMORY_LOCK:
        _MEMORY.setdefault(identity, found)
        return _MEMORY[identity]
