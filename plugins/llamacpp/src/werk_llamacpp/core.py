"""The llama.cpp adapter's core: its managed ``llama-server`` child and the evidence about it.

:class:`LlamaServerCore` starts and restarts the child (a fresh generation whenever the last one
is gone), holds the state slot's lock and owner token, computes the compatibility key of
the live generation, runs the functional probe once per generation and reports capabilities
from it (the ``werk_capabilities`` and ``werk_compat_key`` operations). The state model
and the compatibility key's dimensions are described in :mod:`werk_llamacpp.adapter`; named-state work is
:mod:`.states`, chat forwarding and planning :mod:`.adapter`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from collections import OrderedDict
from typing import Any

from werk_host.plugin import (
    CapabilityId,
    CapabilityReport,
    ChatLimits,
    ErrorCode,
    HostConfig,
    ModelManifest,
    WerkError,
    hookimpl,
)

from .binary import find_llama_server, inspect_executable
from .capabilities import capability_reports
from .gguf_meta import GgufError, default_context, partial_cache, read_metadata
from .integrity import key_id, load_key
from .modelfiles import release_wanted
from .native import LlamaServerClient, NativeConnectionError, NativeError, NativeHTTPError
from .probe import ProbeResult, run_probe
from .process import LlamaServerProcess, LlamaServerStartupError, last_flag_value
from .proxy import LlamaConnectionPool as ConnectionPool
from .slots import SlotRouter

log = logging.getLogger(__name__)

BACKEND_ID = "llama.cpp"
PLUGIN_NAME = "llamacpp"
CACHE_LAYOUT = "werk-llamacpp-slot-v3"
CHUNK = 1 << 20
#: Bound on one prefill or decode completion on the state slot: a long document on a CPU takes
#: minutes, far beyond the native client's default request timeout.
STATE_WORK_TIMEOUT_S = 3600.0
#: Bound on the ``/health`` answer required before state work (a stopped child never answers).
HEALTH_TIMEOUT_S = 5.0
#: Default bound on waiting for a free ordinary slot (backend option ``slot_wait_s``).
SLOT_WAIT_S = 30.0
_CTX_FLAGS = ("-c", "--ctx-size")


def model_files_fingerprint(manifest: ModelManifest) -> str:
    """SHA-256 over the size and modification time of every model file, as found now.

    The manifest identity records each file's SHA-256 at install time; this dimension also
    tells apart a file replaced in place afterwards (the weights a process loaded)."""
    try:
        prints = [[st.st_size, st.st_mtime_ns] for st in (os.stat(f.path) for f in manifest.files)]
    except OSError as err:
        raise unavailable("a model file of this manifest cannot be read") from err
    return hashlib.sha256(json.dumps(prints, separators=(",", ":")).encode()).hexdigest()


def _available_memory() -> int:
    """Host memory available now (``MemAvailable``; free pages where that cannot be read)."""
    try:
        with open("/proc/meminfo", "rb") as f:
            for line in f:
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 0


def start_child(proc: LlamaServerProcess) -> None:
    """Start ``proc``; a failed start is logged with its native log tail and raised as a
    non-retryable ``unavailable`` carrying the last lines (redacted as the log is)."""
    try:
        proc.start()
    except LlamaServerStartupError as err:
        log.error("llama-server failed to start: %s\n%s", err, err.log_tail)
        tail = "\n".join(err.log_tail.splitlines()[-12:])
        raise WerkError(
            ErrorCode.UNAVAILABLE, f"llama-server failed to start; native log tail:\n{tail}", retryable=False
        ) from err


def unavailable(message: str) -> WerkError:
    return WerkError(ErrorCode.UNAVAILABLE, message, retryable=True)


class LlamaServerCore:
    """One installed GGUF model's managed ``llama-server``: its life, state slot and evidence."""

    def __init__(self, config: HostConfig, manifest: ModelManifest, options: dict[str, Any] | None = None) -> None:
        opts = dict(options or {})
        self.config = config
        self.manifest = manifest
        self.instance_id = f"llamacpp:{manifest.name}"
        self.binary_path = find_llama_server(opts.get("llama_server"))
        self.parallel = int(opts.get("parallel", 2))
        if "ctx" in opts:
            self.ctx = int(opts["ctx"])
        else:  # the trained context per slot, where memory allows (:mod:`.gguf_meta`)
            self.ctx = self.parallel * default_context(manifest.primary_path, self.parallel, _available_memory())
        self.threads = int(opts["threads"]) if "threads" in opts else None
        self.warmup_tokens = int(opts.get("warmup_tokens", config.warmup_tokens))  # --warmup-tokens
        self.work_dir = config.home / "backends" / "llamacpp"
        self._life = threading.RLock()
        self.slot_lock = threading.Lock()  # held by every user of the state slot: named states, session snapshots
        self.router = SlotRouter(self.slot_lock, float(opts.get("slot_wait_s", SLOT_WAIT_S)))
        self._token_key: bytes | None = None
        self._process: LlamaServerProcess | None = None
        self._probes: dict[str, ProbeResult] = {}
        self._model_files: dict[str, str] = {}
        self._held_state: str | None = None
        #: bumped whenever the state slot's contents change hands (:attr:`_slot_owner` is set):
        #: with one slot, ordinary leases compare it (:mod:`.slots`, "Owners")
        self.state_epoch = 0
        #: per process generation: why prompt caches are off (evidence, :mod:`.promptcache`)
        self.prompt_cache_off: dict[str, str] = {}
        self._partial_cache: tuple[str | None] | None = None
        self._count_cache: OrderedDict[bytes, int] = OrderedDict()
        self._exited: set[str] = set()  # generations whose child exited (:meth:`_watch`)
        self._identity = ("none", f"{self.instance_id}#none")
        self._proxy_pools: dict[str, ConnectionPool] = {}
        self._limits: tuple[tuple[str | None, str | None], ChatLimits] | None = None
        self.last_decode: dict[str, Any] = {}
        self.closed = False

    # -- process lifecycle ---------------------------------------------------------------
    def process(self) -> LlamaServerProcess:
        """The live child, starting a fresh one (new generation) when none is alive."""
        with self._life:
            if self.closed:
                raise unavailable("the llama.cpp adapter is shut down")
            proc = self._process
            if proc is not None and proc.alive():
                return proc
            if proc is not None:
                log.warning("llama-server (generation %s) is gone; starting a fresh child", proc.generation[:8])
                proc.stop()
                self._slot_owner = None
                for pool in self._proxy_pools.values():
                    pool.close()
                self._proxy_pools.clear()
            model_files = model_files_fingerprint(self.manifest)
            proc = LlamaServerProcess(
                self.manifest.primary_path,
                binary=self.binary_path,
                parallel=self.parallel,
                ctx=self.ctx,
                work_dir=self.work_dir,
                warmup_tokens=self.warmup_tokens,
                threads=self.threads,
                extra_args=self._extra_args(),
                cache_release=release_wanted(self.config.model_cache_release),
            )
            start_child(proc)
            self._model_files[proc.generation] = model_files  # before any reader can see proc
            self._process = proc
            self._watch(proc)
            return proc

    def _watch(self, proc: LlamaServerProcess) -> None:
        """Note the child's exit as it happens: a thread blocked in ``waitid`` (without reaping;
        stopping reaps) adds its generation to the exited ones, so :meth:`current` and
        :meth:`identity` read a set instead of asking the kernel on every request."""
        pid, generation = proc.pid, proc.generation

        def wait() -> None:
            try:
                if pid is not None:
                    os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
            except OSError:
                pass  # already reaped (stopped): gone either way
            finally:
                self._exited.add(generation)

        threading.Thread(target=wait, name=f"llama-server-exit-{generation[:8]}", daemon=True).start()

    def _extra_args(self) -> list[str]:
        """``--metrics`` (child counters for observability), ``--alias`` (the API reports the
        manifest name, never the model's file path) and ``--cache-ram 0`` (llama-server's own
        host-memory prompt cache is shared by every slot and so by every key; Werk's prompt
        caches are per key: docs/prompt-cache.md), each only when the help advertises it."""
        args: list[str] = []
        if self._advertises("--cache-ram"):
            args += ["--cache-ram", "0"]
        if self._advertises("--metrics"):
            args.append("--metrics")
        if self._advertises("--alias"):
            args += ["--alias", self.manifest.name]
        return args

    def _advertises(self, flag: str) -> bool:
        return inspect_executable(self.binary_path).advertises(flag)

    def current(self) -> LlamaServerProcess | None:
        """The child while it runs (its exit noted by :meth:`_watch`), else ``None``."""
        proc = self._process
        return proc if proc is not None and proc.generation not in self._exited else None

    def identity(self) -> str:
        proc = self._process  # :meth:`current`, read here directly: every capability gate asks
        generation = proc.generation if proc is not None and proc.generation not in self._exited else "none"
        named = self._identity  # (generation, identity): one string per child, not one per call
        if named[0] != generation:
            named = self._identity = (generation, f"{self.instance_id}#{generation}")
        return named[1]

    def close(self) -> None:
        with self._life:
            self.closed = True
            proc, self._process = self._process, None
            for pool in self._proxy_pools.values():
                pool.close()
            self._proxy_pools.clear()
        if proc is not None:
            proc.stop()

    @property
    def state_slot(self) -> int:
        proc = self.current()
        n = proc.effective_parallel() if proc else self.parallel
        return max(n - 1, 0)

    def client(self, proc: LlamaServerProcess) -> LlamaServerClient:
        """A dedicated client for the state slot (the process's own one)."""
        assert proc.client is not None
        return proc.client

    def native_failure(self, err: NativeError, what: str) -> WerkError:
        """Map a native failure to a typed error; a dead child is restarted on next use."""
        log.error("llama-server %s failed: %s", what, err)
        if isinstance(err, NativeConnectionError) or self.current() is None:
            self._slot_owner = None
            return unavailable(f"llama-server stopped answering during {what}")
        if isinstance(err, NativeHTTPError) and err.status == 503:
            return unavailable(f"llama-server is busy or loading; {what} did not run")
        return WerkError(ErrorCode.INTERNAL, f"llama-server {what} failed")

    # -- evidence ------------------------------------------------------------------------
    def compat_key_of(self, proc: LlamaServerProcess) -> dict[str, str]:
        """The compatibility key of states ``proc`` writes and may restore: every dimension
        that decides whether a slot snapshot fits it, and not the process generation."""
        prints = proc.fingerprints()
        return {
            "backend": BACKEND_ID,
            "executable_sha256": prints["executable_sha256"],
            "help_sha256": prints["help_sha256"],
            "kv_args_sha256": prints["kv_args_sha256"],
            "model_identity": self.manifest.identity,
            "model_files": self._model_files[proc.generation],
            "cache_layout": CACHE_LAYOUT,
            "tokens_key": key_id(self.token_key),
        }

    @property
    def token_key(self) -> bytes:
        """This adapter's key for token digests (:func:`.integrity.load_key`)."""
        with self._life:
            if self._token_key is None:
                self._token_key = load_key(self.work_dir)
            return self._token_key

    def check_answering(self, proc: LlamaServerProcess) -> None:
        """``unavailable`` (retryable) unless ``proc`` answers ``/health`` within the bound."""
        try:
            ready = self.client(proc).health(timeout=HEALTH_TIMEOUT_S)
        except NativeError as err:
            raise self.native_failure(err, "health check") from err
        if not ready:
            raise unavailable("llama-server is not ready")

    @hookimpl(specname="werk_compat_key")
    def compat_key(self, model_id: str) -> dict[str, str]:
        """:meth:`compat_key_of` the live process, unless none runs for ``model_id`` or its
        functional probe failed (then no state is reusable: ``unavailable``). Before the probe
        has run its key is reported; decode runs the probe before any restore."""
        proc = self.current()
        if proc is None or model_id != self.manifest.name:
            raise unavailable("no live llama-server for this model")
        probe = self._probes.get(proc.generation)
        if probe is not None and not probe.passed:
            raise unavailable("the functional slot probe failed for this llama-server generation")
        return self.compat_key_of(proc)

    def probe_result(self) -> ProbeResult | None:
        proc = self.current()
        return self._probes.get(proc.generation) if proc else None

    @hookimpl(specname="werk_capabilities")
    def capabilities(self) -> dict[CapabilityId, CapabilityReport]:
        proc = self.current()
        return capability_reports(proc is not None, self._probes.get(proc.generation) if proc else None)

    def ensure_probed(self, proc: LlamaServerProcess) -> None:
        """Run the functional probe once per generation (caller holds the slot lock)."""
        result = self._probes.get(proc.generation)
        if result is None:
            result = run_probe(proc, id_slot=self.state_slot)
            self._probes[proc.generation] = result
            self._slot_owner = None
            log.info(
                "llama-server generation %s state probe %s%s",
                proc.generation[:8],
                "passed" if result.passed else "failed",
                f": {result.reason}" if result.reason else "",
            )
        if not result.passed:
            kind = self.partial_cache_kind()
            if kind is not None and "--swa-full" not in proc.argv:
                # the same child fails the same way on every retry: not retryable, and the fix named
                raise WerkError(
                    ErrorCode.UNAVAILABLE,
                    f"llama.cpp named state is unavailable: this model keeps a {kind} cache, which "
                    "llama-server does not reuse after a restore unless it keeps the full cache; launch "
                    "it with --swa-full (WERK_LLAMA_ARGS=--swa-full or the instance's args; "
                    f"docs/prompt-cache.md). The functional probe failed ({result.reason})",
                    retryable=False,
                )
            raise unavailable(f"llama.cpp named state is unavailable: the functional probe failed ({result.reason})")

    # -- slots and connections -----------------------------------------------------------
    def context_per_slot(self, proc: LlamaServerProcess | None) -> int | None:
        """Per-request context from the launch arguments (``-c`` split over ``-np`` slots)."""
        if proc is None:
            return None
        argv = proc.argv[1:]
        if "--kv-unified" in argv or "-kvu" in argv:
            return None  # a unified cache is shared: no fixed per-request bound from arguments
        raw = last_flag_value(argv, _CTX_FLAGS)
        n = proc.effective_parallel()
        if raw is None or not raw.isdigit() or n < 1 or int(raw) == 0:
            return None
        return int(raw) // n

    def proxy_pool(self, proc: LlamaServerProcess) -> ConnectionPool:
        with self._life:
            pool = self._proxy_pools.get(proc.generation)
            if pool is None:
                pool = ConnectionPool(
                    proc.host, proc.port or 0, api_key=proc.api_key, bounds=self.config.backend_bounds
                )
                self._proxy_pools[proc.generation] = pool
            return pool

    @property
    def _slot_owner(self) -> str | None:
        """The named state's handle token the state slot holds, if any (None: none known)."""
        return self._held_state

    @_slot_owner.setter
    def _slot_owner(self, token: str | None) -> None:
        self._held_state = token
        self.state_epoch += 1

    def partial_cache_kind(self) -> str | None:
        """:func:`.gguf_meta.partial_cache` of the model file, read once (``None`` when unreadable)."""
        if self._partial_cache is None:
            try:
                kind = partial_cache(read_metadata(self.manifest.primary_path))
            except (OSError, GgufError, ValueError):
                kind = None
            self._partial_cache = (kind,)
        return self._partial_cache[0]

    def forget_slot(self) -> None:
        """Something other than state work may have used the state slot."""
        self._slot_owner = None
