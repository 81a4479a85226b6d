"""Remembered launches: ``werk serve`` (``run``, ``chat``) spawns its backend child before the host is imported.

Most of a small model's start is Python importing the host before the plugin's plan spawns the
child (docs/operations.md, "Remembered launches"). A start of the same serving command
in the same home plans the same child again, so the plan of the last start is remembered and
spawned at once; the plugin's own plan, made as always, then adopts that child only if it plans
exactly the same process. The contract:

* **What is remembered.** During the start of a command of :data:`COMMANDS` (``werk serve``'s
  deploy, the model of ``werk run`` or ``werk chat``; between :func:`prestart` and
  :func:`settle`), the first child that a plugin starts through a :class:`Reservation`
  (:func:`reserve`, then :class:`~werk_host.backends.managed.ManagedProcess` with ``launch=``)
  and that becomes ready is remembered in ``WERK_HOME/launches/v1.json`` (0600, in a private
  directory) under the command's key: the SHA-256 of the command's words without the ``--port``
  value (and ``werk run``'s PROMPT, :func:`_without_prompt`), the working directory and every
  ``WERK_*`` variable but ``WERK_HOME`` (hashed: ``WERK_API_KEYS`` holds keys). The entry holds the child's
  arguments, environment changes, working directory and log file as templates of the
  reservation's generation, port, secret and run directory (never the secret itself), the
  status (device, inode, size, times) of every file its arguments name, the directories its run
  directory held, and its resident size once ready. At most :data:`MAX_ENTRIES` entries are
  kept; an entry is rewritten only when its template changes.
* **When it is spawned.** :func:`prestart`, the first thing such a command does, spawns the
  remembered child under fresh values (a new generation, secret and free port; its run
  directory created and locked as :func:`~werk_host.backends.child.create_run_dir` does) only
  when all of these hold: the parent-death guard is available (Linux), the memo file is ours
  and not writable by others, every remembered file has its remembered status (a rebuilt
  executable or changed model is never started from memory), ``werk serve``'s listen address is
  free, the remembered resident size is at most an eighth of the memory available now, and no
  accelerator device is present (the host's admission must see the accelerators as they are).
  Anything unreadable is a miss, never an error.
* **Adoption.** :func:`reserve` hands the plugin the prestarted values when its backend name,
  work directory, run-directory prefix and listen host are the remembered ones and the child
  still runs; else fresh ones (and the prestarted child is discarded). ``ManagedProcess.start``
  adopts the child only if the arguments, environment, working directory, log file and guard
  it was about to use are exactly the prestarted child's; otherwise it kills that child's group,
  reaps it and spawns its own in the same run directory.
* **Nothing is left.** :func:`settle`, called once the start ended however it ended,
  and interpreter exit discard an unclaimed child: its group is killed and reaped, its run
  directory removed. Like every managed child it dies with this process (SIGKILL included).

This module is imported before the host: it imports only the standard library and the host's
process primitives.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import hashlib
import json
import os
import signal
import socket
import stat
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from werk_host.backend_caches import remove_tree
from werk_host.backends.child import ManagedChild, available_guard, create_run_dir, logger, spawn
from werk_host.digests import file_status
from werk_host.paths import PrivateDirError, ensure_private_dir, werk_home

__all__ = [
    "MAX_ENTRIES",
    "Prestarted",
    "Reservation",
    "command_of",
    "free_port",
    "loading",
    "prestart",
    "reserve",
    "settle",
    "unavailable",
]

VERSION = 1
MAX_ENTRIES = 16
MAX_MEMO_BYTES = 1 << 20
#: Devices whose memory the host's admission reads: with one present nothing is prestarted.
ACCELERATOR_DEVICES = ("/dev/nvidiactl", "/dev/kfd")
#: The remembered child's resident size may be at most this share of the memory available now.
MEMORY_SHARE = 8
#: The commands that start a backend at once: ``werk serve``'s deploy, ``werk run``'s and ``werk chat``'s model.
COMMANDS = frozenset({"serve", "run", "chat"})

Parts = list[Any]
"""A template: literal strings and ``{"$": name}`` for one of the reservation's values."""


def free_port(host: str = "127.0.0.1") -> int:
    """An ephemeral TCP port that is free on ``host`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def _secret() -> str:
    return base64.urlsafe_b64encode(os.urandom(32)).rstrip(b"=").decode("ascii")


# -- templates ------------------------------------------------------------------------------


def _template(text: str, values: Mapping[str, str]) -> Parts:
    """``text`` with each occurrence of a value (longest first) replaced by its name; the
    ``port``, a short number, only as the whole text or after its last ``:`` or ``=``."""
    parts: Parts = [text]
    for name in sorted(values, key=lambda n: -len(values[n])):
        value = values[name]
        if not value:
            continue
        split: Parts = []
        for part in parts:
            if not isinstance(part, str) or value not in part:
                split.append(part)
            elif name == "port":
                head = part.removesuffix(value)
                if part.endswith(value) and (not head or head.endswith((":", "="))):
                    split += [head, {"$": name}] if head else [{"$": name}]
                else:
                    split.append(part)
            else:
                for i, piece in enumerate(part.split(value)):
                    if i:
                        split.append({"$": name})
                    if piece:
                        split.append(piece)
        parts = split
    return parts


def _fill(parts: object, values: Mapping[str, str]) -> str:
    if not isinstance(parts, list):
        raise ValueError("not a template")
    out = []
    for part in parts:
        if isinstance(part, str):
            out.append(part)
        elif isinstance(part, dict) and part.get("$") in values:
            out.append(values[part["$"]])
        else:
            raise ValueError("not a template part")
    return "".join(out)


# -- the memo -------------------------------------------------------------------------------


def _memo_path(home: Path) -> Path:
    return home / "launches" / f"v{VERSION}.json"


def _read_memo(home: Path) -> dict[str, Any]:
    """The remembered launches of ``home`` by key; empty when missing, foreign, shared or malformed."""
    try:
        fd = os.open(_memo_path(home), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return {}
    with os.fdopen(fd, "rb") as source:
        st = os.fstat(source.fileno())
        if st.st_uid != os.getuid() or st.st_mode & 0o022 or not stat.S_ISREG(st.st_mode):
            return {}
        raw = source.read(MAX_MEMO_BYTES + 1)
    try:
        data = json.loads(raw) if len(raw) <= MAX_MEMO_BYTES else None
    except ValueError:
        return {}
    if not isinstance(data, dict) or data.get("version") != VERSION or not isinstance(data.get("launches"), dict):
        return {}
    launches: dict[str, Any] = data["launches"]
    return launches


def _write_memo(home: Path, launches: Mapping[str, Any]) -> None:
    directory = ensure_private_dir(home / "launches")
    path = _memo_path(home)
    tmp = directory / f".v{VERSION}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump({"version": VERSION, "launches": launches}, out, separators=(",", ":"))
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _status(path: str) -> list[int] | None:
    """The status of the regular file ``path`` (:func:`werk_host.digests.file_status`), else ``None``."""
    try:
        return file_status(Path(path)) if os.path.isfile(path) else None
    except (OSError, ValueError):
        return None


def _available_bytes() -> int | None:
    """``MemAvailable`` of ``/proc/meminfo``; ``None`` where it cannot be read."""
    try:
        with open("/proc/meminfo", "rb") as meminfo:
            for line in meminfo:
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _resident_bytes(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/statm", "rb") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


# -- the serving command --------------------------------------------------------------------


def command_of(words: Sequence[str]) -> str | None:
    """The command ``werk words`` names: its first word that is not an option (``werk`` itself
    has only ``--version`` and ``--help``)."""
    return next((word for word in words if not word.startswith("-")), None)


def _home(words: Sequence[str]) -> Path | None:
    """The home ``werk serve words`` uses; ``None`` when an abbreviated ``--home`` makes it unsure."""
    home: str | None = None
    for i, word in enumerate(words):
        name, eq, value = word.partition("=")
        if name == "--home":
            home = value if eq else (words[i + 1] if i + 1 < len(words) else None)
        elif len(name) > 4 and "--home".startswith(name):
            return None
    return werk_home(home)


def _key(words: Sequence[str]) -> str:
    kept: list[str] = []
    skip = False
    for word in words:
        if skip:
            skip = False
        elif word == "--port":
            skip = True
        elif not word.startswith("--port="):
            kept.append(word)
    if command_of(kept) == "run":
        kept = _without_prompt(kept)
    env = sorted((k, v) for k, v in os.environ.items() if k.startswith("WERK_") and k != "WERK_HOME")
    # hashed: the variables may hold API keys (WERK_API_KEYS), which no file of Werk's repeats
    return hashlib.sha256(json.dumps([kept, os.getcwd(), env]).encode()).hexdigest()


def _without_prompt(words: list[str]) -> list[str]:
    """``werk run``'s words without its PROMPT: the last of two or more words after ``run`` that
    are neither an option nor the word after one (its value, as far as the words tell). A guess
    that keeps the prompt only makes every such start a miss."""
    plain: list[int] = []
    command, value = False, False
    for i, word in enumerate(words):
        if not command:
            command = word == "run"
        elif word.startswith("-") and word != "-":
            value = "=" not in word
        elif value:
            value = False
        else:
            plain.append(i)
    return [w for i, w in enumerate(words) if len(plain) < 2 or i != plain[-1]]


class Prestarted(NamedTuple):
    """A child spawned from memory, and exactly what it was spawned with."""

    child: ManagedChild
    argv: list[str]
    env: dict[str, str]
    cwd: str
    log_path: str
    started_at: float


class Reservation:
    """A backend child's generation, secret, port and run directory (held by ``owner_fd``)."""

    def __init__(
        self,
        name: str,
        work_dir: Path,
        prefix: str,
        host: str,
        generation: str,
        secret: str,
        port: int,
        run_dir: Path,
        owner_fd: int,
    ) -> None:
        self.name, self.work_dir, self.prefix, self.host = name, work_dir, prefix, host
        self.generation, self.secret, self.port = generation, secret, port
        self.run_dir, self.owner_fd = run_dir, owner_fd
        self.prestarted: Prestarted | None = None
        #: Where to remember the child once ready: the home and the command's key.
        self.memo: tuple[Path, str] | None = None

    def __repr__(self) -> str:  # never the secret
        return f"<Reservation {self.name} {self.generation[:8]} port={self.port}>"

    def values(self) -> dict[str, str]:
        return {
            "run_dir": str(self.run_dir),
            "generation": self.generation,
            "secret": self.secret,
            "port": str(self.port),
        }

    def adopt(
        self, argv: Sequence[str], env: Mapping[str, str] | None, cwd: str, log_path: str, guard: str | None
    ) -> tuple[ManagedChild, float] | None:
        """The prestarted child and its start time if it is exactly this process; else ``None``
        (and that child, if any, is killed and reaped)."""
        pre, self.prestarted = self.prestarted, None
        if pre is None:
            return None
        same = (
            list(argv) == pre.argv
            and dict(os.environ if env is None else env) == pre.env
            and cwd == pre.cwd
            and log_path == pre.log_path
            and (guard or available_guard()) == pre.child.guard
            and pre.child.popen.poll() is None
        )
        if same:
            logger(__name__).info("%s: adopted the child started from the remembered launch", self.name)
            return pre.child, pre.started_at
        logger(__name__).info("%s: the remembered launch differs from this start's plan; starting anew", self.name)
        _kill(pre.child)
        return None

    def remember(
        self, argv: Sequence[str], env: Mapping[str, str] | None, cwd: str, log_path: str, guard: str | None, pid: int
    ) -> None:
        """Remember this ready child for the command's next start (see the module docstring)."""
        memo, self.memo = self.memo, None
        if memo is None or guard not in (None, "pdeathsig"):
            return
        home, key = memo
        values = self.values()
        child_env = dict(os.environ if env is None else env)
        try:
            entry: dict[str, Any] = {
                "name": self.name,
                "work_dir": _template(str(self.work_dir), {"home": str(home)}),
                "prefix": self.prefix,
                "host": self.host,
                "argv": [_template(arg, values) for arg in argv],
                "env_unset": sorted(k for k in os.environ if k not in child_env),
                "env_set": {k: _template(v, values) for k, v in child_env.items() if os.environ.get(k) != v},
                "cwd": _template(cwd, values),
                "log": _template(log_path, values),
                "dirs": sorted(
                    str(p.relative_to(self.run_dir))
                    for p in self.run_dir.rglob("*")
                    if p.is_dir() and not p.is_symlink()
                ),
                "files": {arg: st for arg in argv if (st := _status(arg)) is not None},
            }
            launches = _read_memo(home)
            old = launches.pop(key, None)
            rss = _resident_bytes(pid)
            same = isinstance(old, dict) and {k: v for k, v in old.items() if k != "rss"} == entry
            if same and isinstance(old.get("rss"), int) and (rss or 0) <= old["rss"]:
                return
            entry["rss"] = rss
            launches[key] = entry
            _write_memo(home, dict(list(launches.items())[-MAX_ENTRIES:]))
        except (OSError, PrivateDirError) as err:
            logger(__name__).info("cannot remember the launch of %s: %s", self.name, err)


# -- this process's start -------------------------------------------------------------------


class _Start:
    """A start of a command of :data:`COMMANDS` between :func:`prestart` and its first reservation
    or :func:`settle`."""

    def __init__(self, home: Path, key: str, reservation: Reservation | None) -> None:
        self.home, self.key, self.reservation = home, key, reservation


_lock = threading.Lock()
_start: _Start | None = None


def _kill(child: ManagedChild) -> None:
    if child.popen.returncode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.pid, signal.SIGKILL)
    child.popen.wait()
    child.release()


def _discard(reservation: Reservation) -> None:
    """Kill a prestarted child nobody adopted and remove its run directory."""
    if reservation.prestarted is not None:
        _kill(reservation.prestarted.child)
        reservation.prestarted = None
    remove_tree(reservation.run_dir, ignore_errors=True)
    with contextlib.suppress(OSError):
        os.close(reservation.owner_fd)


def _take() -> _Start | None:
    global _start
    with _lock:
        start, _start = _start, None
    return start


def _fresh(name: str, work_dir: Path, prefix: str, host: str) -> Reservation:
    """A new generation, secret and free port, and the run directory ``work_dir/<prefix><generation>``
    created and locked (:func:`~werk_host.backends.child.create_run_dir`)."""
    generation = os.urandom(16).hex()
    run_dir, owner_fd = create_run_dir(work_dir, f"{prefix}{generation}")
    try:
        port = free_port(host)
    except BaseException:
        os.close(owner_fd)
        remove_tree(run_dir, ignore_errors=True)
        raise
    return Reservation(name, work_dir, prefix, host, generation, _secret(), port, run_dir, owner_fd)


def _spawn_remembered(home: Path, entry: Mapping[str, Any]) -> Reservation | None:
    """Spawn ``entry`` under fresh values when every condition of the module docstring holds."""
    files = entry["files"]
    if not isinstance(files, dict) or any(_status(path) != st for path, st in files.items()):
        return None
    rss, available = entry.get("rss"), _available_bytes()
    if not isinstance(rss, int) or available is None or rss * MEMORY_SHARE > available:
        return None
    work_dir = ensure_private_dir(_fill(entry["work_dir"], {"home": str(home)}))
    reservation = _fresh(str(entry["name"]), work_dir, str(entry["prefix"]), str(entry["host"]))
    run_dir = reservation.run_dir
    try:
        values = reservation.values()
        for sub in map(Path, entry["dirs"]):
            if sub.is_absolute() or ".." in sub.parts:
                raise ValueError("a run directory's subdirectory outside it")
            ensure_private_dir(run_dir / sub)
        argv = [_fill(arg, values) for arg in entry["argv"]]
        if argv[0] not in files:
            raise ValueError("the program's status is not remembered")
        unset = {str(name) for name in entry["env_unset"]}
        env = {k: v for k, v in os.environ.items() if k not in unset}
        env.update({str(k): _fill(v, values) for k, v in entry["env_set"].items()})
        cwd, log_path = _fill(entry["cwd"], values), _fill(entry["log"], values)
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            child = spawn(argv, env=env, cwd=cwd, stdout=fd, stderr=subprocess.STDOUT, record_dir=run_dir)
        finally:
            os.close(fd)
        reservation.prestarted = Prestarted(child, argv, env, cwd, log_path, time.monotonic())
    except BaseException:
        _discard(reservation)
        raise
    return reservation


def _may_listen(address: tuple[str, int]) -> bool:
    """Whether the host could listen on ``address`` now (port 0: any port can be had)."""
    host, port = address
    if port == 0:
        return True
    try:
        family, kind, proto, _, where = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the host's listener
            probe.bind(where)
    except OSError:
        return False
    return True


def unavailable() -> str | None:
    """Why nothing is prestarted on this machine, or ``None`` when a remembered launch may be."""
    if available_guard() != "pdeathsig":
        return "a prestarted child needs the Linux parent-death guard"
    present = [dev for dev in ACCELERATOR_DEVICES if os.path.exists(dev)]
    if present:
        return f"an accelerator device is present ({present[0]}): the host's admission must find it as it is"
    return None


def prestart(words: Sequence[str], *, listen: tuple[str, int] | None = None) -> None:
    """Begin the start of a command of :data:`COMMANDS` (see the module docstring): spawn its
    remembered child, if any may be. Other commands, and every failure, leave nothing behind.
    ``listen`` is the address ``werk serve`` will listen on: nothing is started when it is taken
    (the host then ends before any backend starts: docs/operations.md, "Start-up")."""
    global _start
    settle()
    if command_of(words) not in COMMANDS or unavailable() is not None:
        return
    home = _home(words)
    if home is None:
        return
    start = _Start(home, _key(words), None)
    entry = _read_memo(home).get(start.key)
    if isinstance(entry, dict) and (listen is None or _may_listen(listen)):
        try:
            start.reservation = _spawn_remembered(home, entry)
        except (OSError, PrivateDirError, ValueError, KeyError, TypeError, AttributeError) as err:
            logger(__name__).debug("the remembered launch was not started: %s", err)
    with _lock:
        _start = start


def loading() -> int:
    """How many prestarted children are loading their model, unclaimed (0 or 1)."""
    with _lock:
        return int(_start is not None and _start.reservation is not None)


def reserve(name: str, work_dir: Path, *, prefix: str, host: str) -> Reservation:
    """The generation, secret, free port and locked run directory ``work_dir/<prefix><generation>``
    for a backend child: the prestarted child's when it is this one's (see the module docstring).
    Only the first reservation of a ``werk serve`` start is remembered."""
    start = _take()
    memo = None if start is None else (start.home, start.key)
    pre = None if start is None else start.reservation
    if pre is not None:
        running = pre.prestarted is not None and pre.prestarted.child.popen.poll() is None
        if running and (pre.name, pre.work_dir, pre.prefix, pre.host) == (name, Path(work_dir), prefix, host):
            pre.memo = memo
            return pre
        _discard(pre)
    reservation = _fresh(name, Path(work_dir), prefix, host)
    reservation.memo = memo
    return reservation


def settle() -> None:
    """End the start-up deploy: an unclaimed prestarted child is discarded, and no later
    reservation of this process is remembered."""
    start = _take()
    if start is not None and start.reservation is not None:
        _discard(start.reservation)


atexit.register(settle)
