"""Native session snapshots for ``werk chat``/``werk run`` on llama.cpp (docs/chat.md).

:class:`LlamaSessionSlot` is this plugin's :class:`werk_host.plugin.SessionSlot`
for one live ``llama-server`` (the ``werk_session_slot`` hook). The host owns the files
and the rules (session key equality, private paths, size, SHA-256, receipts, observed reuse:
docs/chat.md); this module only touches the process:

* **Session slot**: the adapter's state slot (the last one). Session chat requests are the
  adapter's ``/v1/chat/completions`` relay pinned to it with ``id_slot`` and ``cache_prompt``
  (any slot the request names is dropped), holding the adapter's ``slot_lock`` from before it is
  sent until its response is closed (waiting at most the adapter's ``router.wait_s``, then a
  retryable ``unavailable``), so no named-state work meets it there; anything a named state held
  there is forgotten (:meth:`LlamaCppAdapter.forget_slot`).
* **Session key**: the adapter's compatibility key of named states (executable and help
  SHA-256, KV-relevant arguments, model identity and files, cache layout), plus what docs/chat.md
  adds for sessions: the *complete* effective arguments (so a session saved with native warmup
  on is not restored with it off, and vice versa), the SHA-256 of every shared library the
  running process has mapped, the runtime-relevant environment of the running process
  (:data:`RUNTIME_ENV_PREFIXES`; never the API key) and the session layout. Read from
  ``/proc/<pid>`` after native readiness; where that cannot be read there are no session
  snapshots (``unavailable``), never an unknown runtime trusted.
* **Save**: ``POST /slots/<slot>?action=save`` into the process's private slot directory; the
  file must be a regular file of exactly the acknowledged size. The payload is the slot file;
  the acknowledgement (``n_saved`` tokens, ``n_written`` bytes) travels as ``adapter_meta``.
* **Restore**: the slot must be idle; the session key must be equal; the verified payload must be
  ``n_written`` bytes; llama-server reads it through :func:`.snapshot.presented` (the very
  inode the host verified) and must acknowledge exactly ``n_saved``/``n_written``. Any failure
  erases the slot before the error is raised.
* **Cache count**: ``usage.prompt_tokens_details.cached_tokens``, which must agree with
  ``timings.cache_n`` and add up with ``timings.prompt_n`` to ``prompt_tokens`` when llama-server
  reports them; otherwise ``None``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import stat
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Final

from werk_host.plugin import ErrorCode, InferenceResponse, JsonObject, Snapshot, StoredStateRef, WerkError, sha256_file
from werk_host.plugin.http import forward

from .native import NativeError
from .process import LlamaServerProcess
from .slots import held_for_life, strip_slot_fields
from .snapshot import acknowledged, presented_entry

if TYPE_CHECKING:
    from .adapter import LlamaCppAdapter

__all__ = ["RUNTIME_ENV_PREFIXES", "SESSION_LAYOUT", "LlamaSessionSlot", "cache_count", "open_session_slot"]

SESSION_LAYOUT: Final = "werk-llamacpp-session-v1"
#: Environment variables of the running llama-server that can change what it computes or
#: loads: ggml/llama settings, GPU selection and runtime libraries, OpenMP/BLAS threading and
#: the dynamic loader's search path and preloads. ``LLAMA_API_KEY`` is never read into it.
RUNTIME_ENV_PREFIXES: Final = (
    "GGML_",
    "LLAMA_",
    "CUDA_",
    "HIP_",
    "ROCR_",
    "HSA_",
    "VK_",
    "ONEAPI_",
    "SYCL_",
    "ZES_",
    "OMP_",
    "KMP_",
    "GOMP_",
    "OPENBLAS_",
    "MKL_",
    "BLIS_",
    "LD_LIBRARY_PATH",
    "LD_PRELOAD",
)
_SECRET_ENV: Final = frozenset({"LLAMA_API_KEY"})
_CHUNK: Final = 1 << 20
_LIB_HASHES: dict[tuple[int, int, int, int], str] = {}
_LIB_LOCK = threading.Lock()


def _unavailable(message: str) -> WerkError:
    return WerkError(ErrorCode.UNAVAILABLE, message, retryable=False)


def _library_sha256(path: str) -> str:
    """SHA-256 of a mapped library, cached by (device, inode, size, mtime)."""
    st = os.stat(path)
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    with _LIB_LOCK:
        known = _LIB_HASHES.get(key)
    if known is None:
        known = sha256_file(path)
        with _LIB_LOCK:
            _LIB_HASHES[key] = known
    return known


def libraries_fingerprint(pid: int) -> str:
    """SHA-256 over the path and SHA-256 of every shared library process ``pid`` has mapped."""
    try:
        mapped = (
            fields[5]
            for line in Path(f"/proc/{pid}/maps").read_text().splitlines()
            if len(fields := line.split(None, 5)) == 6
        )
        found = sorted({path for path in mapped if ".so" in os.path.basename(path) and not path.endswith(" (deleted)")})
        prints = [[path, _library_sha256(path)] for path in found]
    except OSError as err:
        raise _unavailable("the running llama-server's libraries cannot be inspected") from err
    if not prints:
        raise _unavailable("the running llama-server's libraries cannot be inspected")
    return hashlib.sha256(json.dumps(prints, separators=(",", ":")).encode()).hexdigest()


def environment_fingerprint(pid: int) -> str:
    """SHA-256 over the runtime-relevant environment of process ``pid`` (names and values)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError as err:
        raise _unavailable("the running llama-server's environment cannot be inspected") from err
    kept = []
    for item in raw.split(b"\0"):
        name, sep, value = item.decode("utf-8", "replace").partition("=")
        if sep and name not in _SECRET_ENV and name.startswith(RUNTIME_ENV_PREFIXES):
            kept.append([name, value])
    return hashlib.sha256(json.dumps(sorted(kept), separators=(",", ":")).encode()).hexdigest()


class LlamaSessionSlot:
    """The session slot of one live llama-server generation (see the module docstring)."""

    def __init__(self, adapter: LlamaCppAdapter, proc: LlamaServerProcess) -> None:
        self.adapter = adapter
        self.proc = proc
        self._session_key: dict[str, str] | None = None

    def _live(self) -> LlamaServerProcess:
        if self.adapter.current() is not self.proc:
            raise _unavailable("llama-server restarted; this session's native snapshots are off until it reopens")
        return self.proc

    def session_key(self) -> dict[str, str]:
        proc = self._live()
        if self._session_key is None:
            pid = proc.pid
            if pid is None:
                raise _unavailable("llama-server is not running")
            session_key = dict(self.adapter.compat_key_of(proc))
            session_key.update(
                args_sha256=proc.fingerprints()["args_sha256"],
                libraries_sha256=libraries_fingerprint(pid),
                environment_sha256=environment_fingerprint(pid),
                session_layout=SESSION_LAYOUT,
            )
            self._session_key = session_key
        return dict(self._session_key)

    def chat(self, request: JsonObject) -> InferenceResponse:
        proc = self._live()
        body = {k: v for k, v in strip_slot_fields(request).items() if k != "werk"}
        body["cache_prompt"] = True
        lease = self.adapter.router.hold_state_slot()
        try:
            body["id_slot"] = self.adapter.state_slot
            self.adapter.forget_slot()
            response = forward(self.adapter.proxy_pool(proc), "/v1/chat/completions", body)
        except BaseException:
            lease.release()
            raise
        return held_for_life(response, lease)

    def save(self) -> Snapshot:
        proc = self._live()
        assert proc.slot_dir is not None
        name = f"werk-session-{secrets.token_hex(16)}.bin"
        path = proc.slot_dir / name
        with self.adapter.slot_lock:
            try:
                saved = self.adapter.client(proc).slot_save(self.adapter.state_slot, name)
            except NativeError as err:
                path.unlink(missing_ok=True)
                raise self.adapter.native_failure(err, "session save") from err
        try:
            st = os.lstat(path)
            if not stat.S_ISREG(st.st_mode) or st.st_size != saved.n_written or saved.n_saved <= 0:
                raise WerkError(ErrorCode.INTERNAL, "llama-server's save acknowledgement does not match the slot file")
        except BaseException:
            path.unlink(missing_ok=True)
            raise

        def chunks() -> Iterator[bytes]:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd, "rb") as source:
                while chunk := source.read(_CHUNK):
                    yield chunk

        return Snapshot(
            chunks=chunks(),
            size=saved.n_written,
            close=lambda: path.unlink(missing_ok=True),
            adapter_meta={"n_saved": saved.n_saved, "n_written": saved.n_written},
        )

    def restore(self, stored: StoredStateRef) -> int:
        proc = self._live()
        client, slot = self.adapter.client(proc), self.adapter.state_slot
        with self.adapter.slot_lock:
            try:
                return self._restore(proc, stored)
            except WerkError:
                with contextlib.suppress(NativeError):
                    client.slot_erase(slot)
                raise
            finally:
                self.adapter.forget_slot()  # the slot holds a conversation, never a named state

    def _restore(self, proc: LlamaServerProcess, stored: StoredStateRef) -> int:
        n_saved, n_written = acknowledged(stored, self.session_key(), "session snapshot")
        try:
            slots = {s.id: s for s in self.adapter.client(proc).slots()}
        except NativeError as err:
            raise self.adapter.native_failure(err, "session restore") from err
        state = slots.get(self.adapter.state_slot)
        if state is None or state.is_processing:
            raise _unavailable("llama-server's session slot is not idle")
        assert proc.slot_dir is not None
        with presented_entry(stored, proc.slot_dir, n_written, "session snapshot") as (_, name):
            self.adapter.restore_slot_file(proc, name, n_saved, n_written)
        return n_saved

    def cached_tokens(self, usage_event: JsonObject) -> int | None:
        return cache_count(usage_event)


def cache_count(usage_event: JsonObject) -> int | None:
    """``usage.prompt_tokens_details.cached_tokens``, when it agrees with ``timings.cache_n`` and
    adds up with ``timings.prompt_n`` to ``prompt_tokens`` where llama-server reports them."""
    usage = usage_event.get("usage")
    if not isinstance(usage, dict):
        return None
    prompt = usage.get("prompt_tokens")
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    timings = usage_event.get("timings")
    cache_n = timings.get("cache_n") if isinstance(timings, dict) else None
    prompt_n = timings.get("prompt_n") if isinstance(timings, dict) else None
    counts = [v for v in (prompt, cached, cache_n, prompt_n) if v is not None]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in counts):
        return None
    if cached is None:
        cached = cache_n
    if not isinstance(cached, int) or (isinstance(cache_n, int) and cache_n != cached):
        return None
    if isinstance(cache_n, int) and isinstance(prompt_n, int) and isinstance(prompt, int):
        return cached if cache_n + prompt_n == prompt else None
    return cached


def open_session_slot(adapter: LlamaCppAdapter, model_id: str) -> LlamaSessionSlot:
    """The session slot of the adapter's live process (the ``werk_session_slot`` hook).

    ``not_found`` for another model, ``unavailable`` when no process runs, ``unsupported`` when
    the effective arguments disable or move the private slot directory."""
    if model_id != adapter.manifest.name:
        raise WerkError(ErrorCode.NOT_FOUND, "this llama-server serves another model")
    proc = adapter.current()
    if proc is None:
        raise _unavailable("no llama-server runs for this model")
    if proc.slot_dir is None or proc.effective_slot_save_path() != proc.slot_dir:
        raise WerkError(ErrorCode.UNSUPPORTED, "the effective arguments disable or move llama-server's slot saving")
    return LlamaSessionSlot(adapter, proc)
