"""CPU expert page preparation: the explicitly CPU-placed MoE expert pages of the model a
``llama-server`` child is about to load, made resident and mapped before it spawns.

docs/deployments.md, "CPU expert page preparation". The contract:

* **The switch.** ``WERK_LLAMA_PREFETCH`` is ``auto`` (the default) or ``off``
  (:func:`prefetch_mode`); anything else is a startup error (:class:`PrefetchConfigError`).
  ``off`` reads nothing, maps nothing and leases nothing.
* **The plan** (:func:`plan`) comes from the child's final argv and the model's shards (the
  ``-m`` file, or every ``<name>-0000K-of-0000N.gguf`` of a split model, :func:`model_shards`).
  It selects what llama.cpp itself places on the CPU: ``--cpu-moe``/``-cmoe`` every layer's
  ``ffn_(up|down|gate|gate_up)_(ch)exps`` tensors, ``--n-cpu-moe N``/``-ncmoe N`` those of
  layers ``blk.0`` .. ``blk.N-1`` (the same patterns llama.cpp's flags apply). It abstains, with
  the reason, when there is no positive selection (neither flag, or ``N <= 0``), on flags that
  place tensors or load the model otherwise (``-ot``/``--override-tensor``, ``--numa``,
  ``--no-mmap``, ``--mlock``, a ``--load-mode`` other than ``auto``/``mmap``, any direct-io
  flag, ``--override-kv``, a model from ``-hf``/``--model-url``), off Linux, and on GGUF
  metadata it does not support (:func:`werk_llamacpp.gguf_meta.read_tensors`'s errors, a model
  without ``<arch>.expert_count``, split shards that do not name their place). Only complete
  OS pages inside a selected tensor count: a page shared with a neighbour and every dense
  tensor stay for llama.cpp's own loading.
* **The preparation** (:func:`prepare`) first takes its own lease on the shards
  (:class:`werk_host.plugin.filecache.ModelFiles`): a shard whose lease is not granted, or whose
  file is no longer the one planned (device, inode, size, mtime), is left out; with no shard
  left it stops. Each run of selected pages is mapped read-only and shared
  (:class:`werk_host.plugin.pages.FileMapping`) with ``MADV_RANDOM``, so faults read no
  neighbours; ``mincore`` gives what is resident; the missing bytes must fit in
  :data:`MEMORY_SHARE` of the room left (``MemAvailable``, and a cgroup v2 ``memory.max`` minus
  ``memory.current`` where one is set, :func:`memory_room`). At most :data:`MAX_WORKERS`
  threads then populate every chunk (:data:`CHUNK_BYTES`): ``POSIX_FADV_WILLNEED`` for the
  exact file range of a chunk with missing pages, then ``MADV_POPULATE_READ`` (or one read per
  page where the kernel lacks it), which maps resident pages too. Before every chunk but the
  first they check the deadline, before every chunk the cancellation and the memory room.
  Every worker is joined before :func:`prepare` returns, so before the child spawns. A deadline, a cancellation, an
  error or memory pressure stops it: its mappings are dropped and its lease released, and
  native loading goes on as without it.
* **Retention.** A completed preparation keeps its mappings and lease for the child's life;
  :meth:`Preparation.close` (at the child's stop, before the host's own file-cache release)
  cancels, joins, unmaps and releases the lease without advice.
* **What it does not promise.** Mapped pages resist cache-only trimming, but memory pressure
  can still reclaim them; nothing is locked. It is an optional step: it never fails a start.

:class:`Outcome` says what happened, for the instance log (one INFO line on
``werk_llamacpp.prefetch``, :meth:`Outcome.summary`) and for reports (:meth:`Outcome.as_dict`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Literal

from werk_host.plugin.filecache import ModelFiles
from werk_host.plugin.pages import PAGE, FileMapping

from .gguf_meta import GgufError, file_identity, read_tensors

__all__ = [
    "CHUNK_BYTES",
    "DEADLINE_S",
    "ENV",
    "MAX_WORKERS",
    "MEMORY_SHARE",
    "MODES",
    "Abstention",
    "Outcome",
    "Plan",
    "PrefetchConfigError",
    "Preparation",
    "Run",
    "memory_room",
    "model_shards",
    "plan",
    "prefetch_mode",
    "prepare",
    "prepare_for",
]

log = logging.getLogger(__name__)

ENV: Final = "WERK_LLAMA_PREFETCH"
MODES: Final = ("auto", "off")
#: Bytes one worker populates between two checks of the deadline, cancellation and memory.
CHUNK_BYTES: Final = 32 << 20
#: Worker threads at most.
MAX_WORKERS: Final = 2
#: The longest a preparation runs before the child spawns anyway.
DEADLINE_S: Final = 60.0
#: The share of the memory room (:func:`memory_room`) the missing bytes may take.
MEMORY_SHARE: Final = 0.5

_CPU_MOE: Final = ("-cmoe", "--cpu-moe")
_N_CPU_MOE: Final = ("-ncmoe", "--n-cpu-moe")
_MODEL: Final = ("-m", "--model")
#: Flags after which the plan abstains: (names, why).
_CONFLICTS: Final = (
    (("-ot", "--override-tensor"), "a tensor override (-ot/--override-tensor) places tensors itself"),
    (("--numa",), "a NUMA control (--numa) is set"),
    (("--no-mmap", "--mlock"), "an alternative loading mode ({flag}) is set"),
    (("--override-kv",), "a metadata override (--override-kv) is set"),
    (("-hf", "--hf-repo", "-hff", "--hf-file", "-mu", "--model-url"), "the model is not a local file ({flag})"),
)
_LOAD_MODE: Final = ("-lm", "--load-mode")
_MAPPED_LOAD_MODES: Final = ("auto", "mmap")
#: llama.cpp's expert-tensor patterns (``--cpu-moe``; ``--n-cpu-moe`` adds ``blk\.<i>``).
_EXPS: Final = re.compile(r"\.ffn_(up|down|gate|gate_up)_(ch|)exps")
_LAYER: Final = re.compile(r"blk\.(\d+)\.ffn_(up|down|gate|gate_up)_(ch|)exps")
_SPLIT: Final = re.compile(r"^(?P<stem>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


class PrefetchConfigError(ValueError):
    """``WERK_LLAMA_PREFETCH`` names no mode."""


def prefetch_mode(environ: Mapping[str, str] | None = None) -> str:
    """``auto`` (unset or empty too) or ``off``; :class:`PrefetchConfigError` for anything else."""
    value = (os.environ if environ is None else environ).get(ENV, "").strip().lower() or "auto"
    if value not in MODES:
        raise PrefetchConfigError(f"{ENV} must be one of {', '.join(MODES)}, not {value!r}")
    return value


# -- the plan ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Abstention:
    """Why there is nothing to prepare."""

    reason: str


@dataclass(frozen=True)
class Run:
    """Contiguous complete pages of selected tensors in one shard: absolute file offset
    (page-aligned) and length (whole pages)."""

    shard: int
    start: int
    length: int


@dataclass(frozen=True)
class Plan:
    """The selected expert tensors (``selection`` says by which flag) and their complete pages."""

    selection: str
    shards: tuple[Path, ...]
    identities: tuple[tuple[int, int, int, int], ...]
    tensors: tuple[str, ...]
    tensor_bytes: int
    runs: tuple[Run, ...]

    @property
    def page_bytes(self) -> int:
        return sum(r.length for r in self.runs)


def model_shards(model: Path) -> tuple[Path, ...]:
    """``model`` alone, or every shard of the split model it is one shard of."""
    found = _SPLIT.match(model.name)
    if found is None:
        return (model,)
    count = int(found["count"])
    return tuple(model.with_name(f"{found['stem']}-{k:05d}-of-{count:05d}.gguf") for k in range(1, count + 1))


def _scan(argv: Sequence[str]) -> tuple[bool, int | None, str | None] | Abstention:
    """(``--cpu-moe`` given, the last ``--n-cpu-moe``, the last ``-m``) or a conflict."""
    every, first_n, model = False, None, None
    for i, arg in enumerate(argv):
        name, eq, inline = arg.partition("=")
        value = inline if eq else (argv[i + 1] if i + 1 < len(argv) else None)
        for names, why in _CONFLICTS:
            if name in names:
                return Abstention(why.format(flag=name))
        if name.startswith("-") and ("direct-io" in name or name.lstrip("-") == "dio"):
            return Abstention(f"an alternative loading mode ({name}) is set")
        if name in _LOAD_MODE and value not in _MAPPED_LOAD_MODES:
            return Abstention(f"an alternative loading mode ({name} {value}) is set")
        if name in _CPU_MOE:
            every = True
        elif name in _N_CPU_MOE:
            try:
                first_n = int(value or "")
            except ValueError:
                return Abstention(f"{name} {value!r} is not a layer count")
        elif name in _MODEL:
            model = value
    return every, first_n, model


def plan(
    argv: Sequence[str], shard_paths: Sequence[Path] | None = None, *, platform: str = sys.platform
) -> Plan | Abstention:
    """What a child with ``argv`` (without the executable) loads on the CPU and may be prepared
    (module docstring); ``shard_paths`` default to :func:`model_shards` of the last ``-m``."""
    if not platform.startswith("linux"):
        return Abstention("not Linux")
    scanned = _scan(argv)
    if isinstance(scanned, Abstention):
        return scanned
    every, first_n, model = scanned
    if not every and (first_n is None or first_n <= 0):
        return Abstention("no CPU-placed experts (neither --cpu-moe nor a positive --n-cpu-moe N)")
    if shard_paths is None:
        if model is None:
            return Abstention("no model file (-m) in the arguments")
        shard_paths = model_shards(Path(model))
    shards = tuple(Path(p) for p in shard_paths)
    try:
        dirs = [read_tensors(p) for p in shards]
    except (OSError, GgufError) as err:
        return Abstention(f"unsupported GGUF metadata: {err}")
    meta = dirs[0].metadata
    arch = meta.get("general.architecture")
    experts = meta.get(f"{arch}.expert_count") if isinstance(arch, str) else None
    if not isinstance(experts, int) or isinstance(experts, bool) or experts < 1:
        return Abstention(f"unsupported GGUF metadata: not a mixture-of-experts model (no {arch}.expert_count)")
    if len(shards) > 1 and any(d.metadata.get("split.no") != k for k, d in enumerate(dirs)):
        return Abstention("unsupported GGUF metadata: a split shard does not name its place (split.no)")
    selection = "--cpu-moe" if every else f"--n-cpu-moe {first_n}"
    names: list[str] = []
    runs: list[Run] = []
    tensor_bytes = 0
    for k, directory in enumerate(dirs):
        for tensor in directory.tensors:
            layer = _LAYER.search(tensor.name)
            chosen = (
                _EXPS.search(tensor.name) is not None if every else layer is not None and int(layer[1]) < (first_n or 0)
            )
            if not chosen:
                continue
            names.append(tensor.name)
            tensor_bytes += tensor.nbytes
            begin, end = directory.span(tensor)
            start, stop = -(-begin // PAGE) * PAGE, end // PAGE * PAGE
            if stop <= start:
                continue
            if runs and runs[-1].shard == k and runs[-1].start + runs[-1].length == start:
                runs[-1] = Run(k, runs[-1].start, stop - runs[-1].start)
            else:
                runs.append(Run(k, start, stop - start))
    if not names:
        return Abstention(f"no expert tensors match {selection}")
    if not runs:
        return Abstention(f"the expert tensors {selection} selects hold no complete page")
    return Plan(selection, shards, tuple(d.identity for d in dirs), tuple(names), tensor_bytes, tuple(runs))


# -- memory ---------------------------------------------------------------------------------


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def memory_room(proc: Path = Path("/proc"), cgroup_root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """The bytes that may still be used: ``MemAvailable``, and the least ``memory.max`` minus
    ``memory.current`` of this process's cgroup v2 and its ancestors that set one (``None``:
    unknown)."""
    rooms: list[int] = []
    try:
        for line in (proc / "meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                rooms.append(int(line.split()[1]) * 1024)
        own = next((x[3:] for x in (proc / "self" / "cgroup").read_text().splitlines() if x.startswith("0::")), None)
    except (OSError, ValueError, IndexError):
        own = None
    if own is not None:
        group = cgroup_root / own.strip().lstrip("/")
        while True:
            limit, current = _read_int(group / "memory.max"), _read_int(group / "memory.current")
            if limit is not None and current is not None:
                rooms.append(max(limit - current, 0))
            if group == cgroup_root or cgroup_root not in group.parents:
                break
            group = group.parent
    return min(rooms) if rooms else None


# -- the preparation ------------------------------------------------------------------------

Status = Literal["off", "abstained", "prepared", "stopped"]


@dataclass(frozen=True)
class Outcome:
    """What one preparation did (module docstring); byte counts are of the selected pages."""

    status: Status
    reason: str | None = None
    tensors: int = 0
    checked_bytes: int = 0
    missing_bytes: int = 0
    prefaulted_bytes: int = 0
    retained_bytes: int = 0
    duration_s: float = 0.0
    method: str | None = None  # "madvise" or "touch"; None: nothing was populated

    def summary(self) -> str:
        """The instance log's line."""
        if self.status in ("off", "abstained"):
            return f"prefetch: abstained: {self.reason}"
        head = "prefetch: " if self.status == "prepared" else f"prefetch: stopped ({self.reason}): "
        return (
            f"{head}{self.tensors} expert tensors, checked {self.checked_bytes} B, missing {self.missing_bytes} B, "
            f"prefaulted {self.prefaulted_bytes} B, retained {self.retained_bytes} B in {self.duration_s:.3f} s "
            f"({self.method or 'nothing to populate'})"
        )

    def as_dict(self) -> dict[str, object]:
        return {
            "status": self.status,
            "reason": self.reason,
            "tensors": self.tensors,
            "checked_bytes": self.checked_bytes,
            "missing_bytes": self.missing_bytes,
            "prefaulted_bytes": self.prefaulted_bytes,
            "retained_bytes": self.retained_bytes,
            "duration_s": round(self.duration_s, 6),
            "method": self.method,
        }


@dataclass
class Preparation:
    """A preparation's outcome and what it retains (mappings, its lease) until :meth:`close`."""

    outcome: Outcome
    mappings: list[FileMapping] = field(default_factory=list)
    lease: ModelFiles | None = None
    cancelled: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)

    @property
    def retained_bytes(self) -> int:
        return sum(m.length for m in self.mappings if m.address is not None)

    def close(self) -> None:
        """Cancel, join the workers, unmap, then release the lease without advice (idempotent)."""
        self.cancelled.set()
        for thread in self.threads:
            thread.join()
        self.threads = []
        mappings, self.mappings = self.mappings, []
        try:
            for mapping in mappings:
                mapping.close()
        finally:
            lease, self.lease = self.lease, None
            if lease is not None:
                lease.release(advise=False)


@dataclass
class _Chunk:
    mapping: FileMapping
    fd: int
    start: int  # within the mapping
    length: int
    missing: int


def prepare(
    planned: Plan,
    *,
    deadline_s: float = DEADLINE_S,
    chunk_bytes: int = CHUNK_BYTES,
    workers: int = MAX_WORKERS,
    cancel: threading.Event | None = None,
    room: Callable[[], int | None] = memory_room,
) -> Preparation:
    """Lease, map, check and populate ``planned``'s pages (module docstring); never raises for
    the files or the kernel: a stop is an :class:`Outcome` with ``status="stopped"``."""
    began = time.monotonic()
    deadline = began + deadline_s
    prep = Preparation(Outcome("stopped"), cancelled=cancel or threading.Event())
    if chunk_bytes < PAGE or chunk_bytes % PAGE:
        raise ValueError("chunk_bytes must be a positive multiple of the page size")
    state: dict[str, int] = {"started": 0, "remaining": 0, "prefaulted": 0, "touched": 0, "advised": 0}

    def finish(reason: str | None, checked: int = 0, missing: int = 0) -> Preparation:
        method = "touch" if state["touched"] else "madvise" if state["advised"] else None
        retained = 0 if reason is not None else prep.retained_bytes
        if reason is not None:
            prep.close()
        status: Status = "stopped" if reason is not None else "prepared"
        prep.outcome = Outcome(
            status,
            reason,
            len(planned.tensors),
            checked,
            missing,
            state["prefaulted"],
            retained,
            time.monotonic() - began,
            method,
        )
        return prep

    prep.lease = ModelFiles.lease(planned.shards)
    try:
        return _populate(planned, prep, finish, state, deadline, chunk_bytes, workers, room)
    except Exception as err:  # an optional step: whatever went wrong, native loading goes on
        return finish(f"error: {err}")
    except BaseException:
        prep.close()
        raise


def _populate(
    planned: Plan,
    prep: Preparation,
    finish: Callable[..., Preparation],
    state: dict[str, int],
    deadline: float,
    chunk_bytes: int,
    workers: int,
    room: Callable[[], int | None],
) -> Preparation:
    assert prep.lease is not None
    leased = {k: h.fd for k, h in enumerate(prep.lease.held) if h.leased and h.fd is not None}
    usable = {k: fd for k, fd in leased.items() if file_identity(os.fstat(fd)) == planned.identities[k]}
    if not usable:
        return finish(
            "the model file changed since it was planned" if leased else "no model lifetime lease was granted"
        )
    chunks: list[_Chunk] = []
    checked = missing = 0
    try:
        for run in planned.runs:
            fd = usable.get(run.shard)
            if fd is None:
                continue
            mapping = FileMapping(fd, run.start, run.length)
            prep.mappings.append(mapping)
            mapping.advise_random()
            for at in range(0, run.length, chunk_bytes):
                length = min(chunk_bytes, run.length - at)
                absent = length - mapping.resident(at, length)
                checked, missing = checked + length, missing + absent
                chunks.append(_Chunk(mapping, fd, at, length, absent))
    except OSError as err:
        return finish(f"error: {err}", checked, missing)
    available = room()
    if available is None:
        return finish("the memory room is unknown", checked, missing)
    if missing > MEMORY_SHARE * available:
        return finish(f"memory budget: {missing} B missing, {available} B of room", checked, missing)
    queue = deque(chunks)
    state["remaining"] = missing
    stop: list[str] = []
    lock = threading.Lock()

    def next_chunk() -> _Chunk | None:
        with lock:
            if stop or not queue:
                return None
            if prep.cancelled.is_set():
                stop.append("cancelled")
            elif state["started"] and time.monotonic() >= deadline:
                stop.append("deadline")
            elif (left := room()) is None or state["remaining"] > MEMORY_SHARE * left:
                stop.append("memory pressure")
            else:
                chunk = queue.popleft()
                state["started"] += 1
                state["remaining"] -= chunk.missing
                return chunk
            return None

    def work() -> None:
        try:
            while (chunk := next_chunk()) is not None:
                if chunk.missing:
                    _will_need(chunk)
                advised = chunk.mapping.populate(chunk.start, chunk.length, fallback=True)
                with lock:
                    state["prefaulted"] += chunk.missing
                    state["advised" if advised else "touched"] += 1
        except Exception as err:  # an I/O error, EFAULT past a truncated file's end, ...
            with lock:
                stop.append(f"error: {err}")

    count = max(1, min(workers, MAX_WORKERS, len(chunks)))
    prep.threads = [threading.Thread(target=work, name=f"werk-llama-prefetch-{i}", daemon=True) for i in range(count)]
    try:
        for thread in prep.threads:
            thread.start()
    except BaseException:
        prep.cancelled.set()
        raise
    finally:
        for thread in prep.threads:
            if thread.ident is not None:
                thread.join()  # every worker joins before the child spawns
        prep.threads = []
    return finish(stop[0] if stop else None, checked, missing)


def _will_need(chunk: _Chunk) -> None:
    """Read the chunk's exact file range ahead in large requests (the mapping reads page by
    page under ``MADV_RANDOM``); only a hint."""
    with contextlib.suppress(OSError):
        os.posix_fadvise(chunk.fd, chunk.mapping.offset + chunk.start, chunk.length, os.POSIX_FADV_WILLNEED)


def prepare_for(
    argv: Sequence[str],
    *,
    cancel: threading.Event | None = None,
    deadline_s: float = DEADLINE_S,
    environ: Mapping[str, str] | None = None,
) -> Preparation:
    """The switch, the plan and the preparation for a child's argv (without the executable),
    its outcome logged; :class:`PrefetchConfigError` for an unknown mode, else never raises."""
    if prefetch_mode(environ) == "off":
        prep = Preparation(Outcome("off", f"{ENV}=off"))
    else:
        planned = plan(argv)
        if isinstance(planned, Abstention):
            prep = Preparation(Outcome("abstained", planned.reason))
        else:
            try:
                prep = prepare(planned, deadline_s=deadline_s, cancel=cancel)
            except Exception as err:  # an optional step: never the reason a start fails
                log.warning("prefetch: failed: %s", err, exc_info=True)
                prep = Preparation(Outcome("stopped", f"error: {err}"))
    log.info("%s", prep.outcome.summary())
    return prep
