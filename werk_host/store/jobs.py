"""Job records: ``WERK_HOME/jobs/<id>/`` (docs/media.md, "Jobs").

A job-backed route stores its request, status and eventual result here, in the host (never in a
plugin). Contract:

* **Layout.** ``jobs/<id>/request.json`` (the request as the route validated it, written once,
  before the job is listed), ``jobs/<id>/status.json`` (the record: owner, kind, model,
  status, progress, timestamps, result files, error) and the result files themselves
  (``image-0.png``, ...). Ids are ``job_`` and 24 lowercase hex digits. Every file is written
  with the store's descriptor-relative, no-follow helpers (:mod:`._fs`): a new file is created
  exclusively and fsynced, ``status.json`` is replaced atomically by a rename. Directories are
  0700, files 0600.
* **Results before status.** A job's result files are written first; only then does its
  status become ``succeeded`` naming them. A failure while writing them (a full disk) removes
  what was written, and the job is ``failed``: nothing half-written is ever listed.
* **Ownership.** A record names the principal that created it; every read for another
  principal is ``not_found`` (as for states), never ``forbidden``.
* **Quotas.** A principal holds at most ``max_jobs_per_key`` records and
  ``max_bytes_per_key`` bytes of results, and at most ``max_active_per_key`` queued or
  running jobs; the store at most ``max_jobs`` records. Over a bound, a new job is a retryable
  429 ``resource_exhausted``; purging terminal jobs makes room.
* **Restart.** :meth:`JobStore.recover` (at start-up) marks every ``queued`` or ``running``
  record ``failed`` with the reason "the host restarted before the job finished": nothing is
  resumed. Terminal records survive restarts untouched. A directory without a readable
  ``status.json`` (a crash between its two first writes) is removed.
* State pruning (``/werk/v1/states/prune``, prompt-cache pruning) never touches this tree;
  only :meth:`JobStore.purge` removes records.
* **One server, and the CLI beside it.** A serving host holds the advisory lock
  ``jobs/.lock`` (:meth:`JobStore.hold`) while it lives; its in-memory index is the listing,
  loaded by :meth:`recover`. ``werk jobs`` works on the same tree: it lists from disk; it purges
  terminal records (a server drops a record whose directory went, the next time it lists); and
  it cancels through a ``cancel`` marker file in the job's directory when a server holds the
  lock (the server's job runner watches for it), or by writing the record itself when none does.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import secrets
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from werk_host.errors import ErrorCode, WerkError, exhausted
from werk_host.protocol.media import JobError, JobFile, JobProgress, JobStatus, JobView

from . import _fs

log = logging.getLogger(__name__)

JOB_ID_RE: Final = re.compile(r"job_[0-9a-f]{24}")
REQUEST_FILE: Final = "request.json"
STATUS_FILE: Final = "status.json"
CANCEL_FILE: Final = "cancel"
LOCK_FILE: Final = ".lock"
#: The largest ``status.json`` / ``request.json`` read back.
MAX_RECORD_BYTES: Final = 1 << 20
MAX_REQUEST_BYTES: Final = 32 << 20
RESTARTED: Final = "the host restarted before the job finished"


def new_job_id() -> str:
    return "job_" + secrets.token_hex(12)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True)
class JobBounds:
    """The store's quotas (module docstring)."""

    max_jobs: int = 4096
    max_jobs_per_key: int = 256
    max_bytes_per_key: int = 1 << 30
    max_active_per_key: int = 16


@dataclass
class JobRecord:
    """One job's ``status.json``; :meth:`view` is what the protocol shows."""

    id: str
    owner: str
    kind: str
    model: str | None
    status: JobStatus
    created_unix_ms: int
    progress: JobProgress = field(default_factory=JobProgress)
    started_unix_ms: int | None = None
    finished_unix_ms: int | None = None
    results: list[JobFile] = field(default_factory=list)
    error: JobError | None = None
    info: dict[str, Any] = field(default_factory=dict)

    def view(self) -> JobView:
        return JobView(
            id=self.id,
            kind=self.kind,
            model=self.model,
            status=self.status,
            progress=self.progress,
            created_unix_ms=self.created_unix_ms,
            started_unix_ms=self.started_unix_ms,
            finished_unix_ms=self.finished_unix_ms,
            results=list(self.results),
            error=self.error,
            info=dict(self.info),
        )

    def encode(self) -> bytes:
        doc = self.view().model_dump(mode="json")
        doc["owner"] = self.owner
        return json.dumps(doc, sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes) -> JobRecord | None:
        try:
            doc = json.loads(data)
            owner = doc.pop("owner")
            view = JobView.model_validate(doc)
        except (ValueError, KeyError, TypeError, AttributeError):
            return None
        if not isinstance(owner, str) or not JOB_ID_RE.fullmatch(view.id):
            return None
        return cls(
            view.id,
            owner,
            view.kind,
            view.model,
            view.status,
            view.created_unix_ms,
            view.progress,
            view.started_unix_ms,
            view.finished_unix_ms,
            list(view.results),
            view.error,
            dict(view.info),
        )

    @property
    def result_bytes(self) -> int:
        return sum(f.bytes for f in self.results)


@dataclass(frozen=True)
class JobPurge:
    removed: int
    bytes: int


class JobStore:
    """The records under ``root`` (module docstring). Thread-safe."""

    def __init__(self, root: Path, bounds: JobBounds | None = None, *, durable: bool = True) -> None:
        self.root = root
        self.bounds = bounds or JobBounds()
        self.durable = durable
        self._lock = threading.Lock()
        self._records: dict[str, JobRecord] = {}
        self._loaded = False
        self._root_seen: tuple[int, int] | None = None
        self._held: int | None = None

    # -- the tree -------------------------------------------------------------------------
    def _root_fd(self) -> int:
        self.root.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with contextlib.suppress(FileExistsError):
            _fs.make_private_dir(self.root.name, _fs.open_dir(str(self.root.parent), None))
        return _fs.open_dir(str(self.root), None)

    def _root_fd_close(self) -> None:
        os.close(self._root_fd())  # the tree exists

    @contextlib.contextmanager
    def _job_dir(self, job_id: str, *, create: bool = False) -> Any:
        rootfd = self._root_fd()
        try:
            if create:
                _fs.make_private_dir(job_id, rootfd)
            fd = _fs.open_dir(job_id, rootfd)
        finally:
            os.close(rootfd)
        try:
            yield fd
        finally:
            os.close(fd)

    def _write_status(self, record: JobRecord, *, durable: bool = True) -> None:
        with self._job_dir(record.id) as fd:
            _fs.replace_file(STATUS_FILE, fd, record.encode(), durable=durable and self.durable)

    def _read(self, rootfd: int, job_id: str) -> JobRecord | None:
        try:
            fd = _fs.open_dir(job_id, rootfd)
        except OSError:
            return None
        try:
            found = _fs.read_small(STATUS_FILE, fd, MAX_RECORD_BYTES)
        finally:
            os.close(fd)
        if found is None:
            return None
        record = JobRecord.decode(found[0])
        return record if record is not None and record.id == job_id else None

    def load(self) -> list[JobRecord]:
        """Every readable record on disk, oldest first (the CLI's view; nothing changed)."""
        try:
            rootfd = _fs.open_dir(str(self.root), None)
        except OSError:
            return []
        try:
            names = [n for n in os.listdir(rootfd) if JOB_ID_RE.fullmatch(n)]
            records = [r for r in (self._read(rootfd, n) for n in names) if r is not None]
        finally:
            os.close(rootfd)
        return sorted(records, key=lambda r: (r.created_unix_ms, r.id))

    def open_index(self) -> None:
        """Load the index from disk as it is, changing nothing (the CLI beside a server)."""
        with self._lock:
            self._records = {r.id: r for r in self.load()}
            self._loaded = True

    def recover(self) -> int:
        """Take the server's lock and load the index; mark every nonterminal record ``failed``
        (module docstring) and remove unreadable job directories. Returns how many records were
        marked failed. When another live host holds the lock, its jobs are its own: the index is
        loaded as it is and nothing is changed."""
        self._root_fd_close()
        if not self.hold():
            log.warning("another host serves %s: its jobs are left as they are", self.root)
            self.open_index()
            return 0
        marked = 0
        with self._lock:
            self._records = {}
            rootfd = self._root_fd()
            try:
                for name in os.listdir(rootfd):
                    if name.startswith(_fs.TMP_PREFIX) or not JOB_ID_RE.fullmatch(name):
                        continue
                    record = self._read(rootfd, name)
                    if record is None:
                        _fs.remove_entry(name, rootfd)
                        continue
                    if not record.status.terminal:
                        record.status = JobStatus.FAILED
                        record.error = JobError(code=ErrorCode.UNAVAILABLE.value, message=RESTARTED)
                        record.finished_unix_ms = now_ms()
                        record.results = []
                        marked += 1
                        with contextlib.suppress(OSError):
                            self._write_status(record)
                    self._records[record.id] = record
            finally:
                os.close(rootfd)
            self._loaded = True
        return marked

    # -- the server's lock and the CLI's markers --------------------------------------------------
    def hold(self) -> bool:
        """Take the server's lock (module docstring); ``False`` when another process holds it."""
        fd = os.open(self.root / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        self._held = fd
        return True

    def release(self) -> None:
        if self._held is not None:
            os.close(self._held)
            self._held = None

    def served(self) -> bool:
        """Whether a server holds the lock now (the CLI asks)."""
        if not self.root.is_dir():
            return False
        if not self.hold():
            return True
        self.release()
        return False

    def request_cancel(self, job_id: str) -> None:
        """Leave the ``cancel`` marker for the serving host's runner."""
        with self._job_dir(job_id) as fd, contextlib.suppress(FileExistsError):
            _fs.write_new_file(CANCEL_FILE, fd, b"", durable=False)

    def cancel_requested(self, job_id: str) -> bool:
        try:
            with self._job_dir(job_id) as fd:
                return _fs.lstat_at(CANCEL_FILE, fd) is not None
        except OSError:
            return False

    def _drop_removed_locked(self) -> None:
        """Forget records whose directory another process removed (``werk jobs purge``): checked
        only when the tree's directory changed since the last look."""
        try:
            st = os.stat(self.root)
        except OSError:
            return
        seen = (st.st_ino, st.st_mtime_ns)
        if seen == self._root_seen:
            return
        self._root_seen = seen
        try:
            present = set(os.listdir(self.root))
        except OSError:
            return
        for job_id in [j for j in self._records if j not in present]:
            del self._records[job_id]

    # -- records ---------------------------------------------------------------------------
    def create(self, owner: str, kind: str, model: str | None, request: bytes) -> JobRecord:
        """A new ``queued`` record of ``owner`` holding ``request`` (module docstring: quotas)."""
        if len(request) > MAX_REQUEST_BYTES:
            raise WerkError(ErrorCode.INVALID_REQUEST, "the job's request is too large")
        with self._lock:
            self._admit_locked(owner)
            record = JobRecord(new_job_id(), owner, kind, model, JobStatus.QUEUED, now_ms())
            try:
                with self._job_dir(record.id, create=True) as fd:
                    _fs.write_new_file(REQUEST_FILE, fd, request, durable=self.durable)
                    _fs.replace_file(STATUS_FILE, fd, record.encode(), durable=self.durable)
            except OSError as err:
                self._remove_dir(record.id)
                raise exhausted("the job store is full or unwritable") from err
            self._records[record.id] = record
            return record

    def _admit_locked(self, owner: str) -> None:
        bounds = self.bounds
        if len(self._records) >= bounds.max_jobs:
            raise exhausted(f"the job store holds its {bounds.max_jobs} jobs: purge finished ones")
        mine = [r for r in self._records.values() if r.owner == owner]
        if len(mine) >= bounds.max_jobs_per_key:
            raise exhausted(f"this key holds its {bounds.max_jobs_per_key} jobs: purge finished ones")
        if sum(r.result_bytes for r in mine) >= bounds.max_bytes_per_key:
            raise exhausted("this key's job results hold their byte bound: purge finished ones")
        if sum(1 for r in mine if not r.status.terminal) >= bounds.max_active_per_key:
            raise exhausted(f"this key has {bounds.max_active_per_key} jobs queued or running: wait for them")

    def get(self, owner: str | None, job_id: str) -> JobRecord:
        """``job_id``'s record (a copy) if ``owner`` created it (``None``: any owner)."""
        with self._lock:
            self._drop_removed_locked()
            record = self._records.get(job_id)
            if record is None or (owner is not None and record.owner != owner):
                raise WerkError(ErrorCode.NOT_FOUND, "no job has that id")
            return JobRecord(**{**record.__dict__, "results": list(record.results), "info": dict(record.info)})

    def listing(self, owner: str | None) -> list[JobRecord]:
        with self._lock:
            self._drop_removed_locked()
            found = [r for r in self._records.values() if owner is None or r.owner == owner]
        return sorted(found, key=lambda r: (r.created_unix_ms, r.id))

    def request(self, job_id: str) -> bytes:
        with self._job_dir(job_id) as fd:
            found = _fs.read_small(REQUEST_FILE, fd, MAX_REQUEST_BYTES)
        if found is None:
            raise WerkError(ErrorCode.CORRUPT_STATE, "the job's request cannot be read")
        return found[0]

    def update(self, record: JobRecord) -> None:
        """Persist ``record``'s new status (a full disk leaves the old file; the index moves on:
        a nonterminal record on disk becomes ``failed`` at the next start anyway). Only a
        terminal status is fsynced: a crash loses nothing by forgetting ``running``."""
        with self._lock:
            if record.id not in self._records:
                return
            self._records[record.id] = record
            with contextlib.suppress(OSError):
                self._write_status(record, durable=record.status.terminal)

    def save_results(self, record: JobRecord, files: Iterable[tuple[str, str, bytes]]) -> list[JobFile]:
        """Write ``(name, content type, data)`` result files of ``record``; on any failure every
        one written is removed and the ``OSError`` propagates (module docstring)."""
        written: list[JobFile] = []
        with self._job_dir(record.id) as fd:
            try:
                for name, content_type, data in files:
                    _fs.write_new_file(name, fd, data, durable=self.durable)
                    written.append(JobFile(name=name, bytes=len(data), content_type=content_type))
            except BaseException:
                for done in written:
                    with contextlib.suppress(OSError):
                        os.unlink(done.name, dir_fd=fd)
                raise
        return written

    def result(self, owner: str | None, job_id: str, name: str) -> tuple[bytes, str]:
        record = self.get(owner, job_id)
        listed = next((f for f in record.results if f.name == name), None)
        if listed is None or record.status is not JobStatus.SUCCEEDED:
            raise WerkError(ErrorCode.NOT_FOUND, "the job has no result of that name")
        with self._job_dir(job_id) as fd:
            found = _fs.read_small(name, fd, max(listed.bytes, 1))
        if found is None or len(found[0]) != listed.bytes:
            raise WerkError(ErrorCode.CORRUPT_STATE, "the job's result file is missing or changed")
        return found[0], listed.content_type

    def purge(self, owner: str | None, *, ids: Iterable[str] = (), older_than_ms: int | None = None) -> JobPurge:
        """Remove terminal records of ``owner`` (``None``: every owner): the ``ids`` given, else
        all of them (finished before ``older_than_ms`` when given). Queued and running jobs are
        never removed (cancel them first)."""
        wanted = set(ids)
        removed = freed = 0
        with self._lock:
            for record in list(self._records.values()):
                if owner is not None and record.owner != owner:
                    continue
                if wanted and record.id not in wanted:
                    continue
                if not record.status.terminal:
                    continue
                if older_than_ms is not None and (record.finished_unix_ms or 0) >= older_than_ms:
                    continue
                self._remove_dir(record.id)
                del self._records[record.id]
                removed += 1
                freed += record.result_bytes
        return JobPurge(removed, freed)

    def _remove_dir(self, job_id: str) -> None:
        with contextlib.suppress(OSError):
            rootfd = self._root_fd()
            try:
                _fs.remove_entry(job_id, rootfd)
            finally:
                os.close(rootfd)


def jobs_root(home: Path) -> Path:
    return home / "jobs"


__all__ = ["JOB_ID_RE", "JobBounds", "JobPurge", "JobRecord", "JobStore", "jobs_root", "new_job_id"]
