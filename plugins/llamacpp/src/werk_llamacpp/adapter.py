"""The llama.cpp adapter: one managed ``llama-server`` per model, probed slot state.

State model (docs/architecture.md, "llama.cpp slot use" and "Snapshot format of llama.cpp states"):

* One slot, the last one (``state_slot``), is where Werk prefills, restores and decodes
  named states; the functional probe runs there too. A lock (``slot_lock``) serializes that
  work. Ordinary ``/v1`` traffic never reaches that slot while it runs (:mod:`.slots`: every
  relayed request is pinned to a free ordinary slot; with one slot only it holds the lock).
* A prefilled state's live copy is whatever the state slot holds. The adapter remembers which
  handle the slot holds (``_slot_owner``) and forgets it whenever anything else may have used
  the slot; decode then restores the state from its snapshot before generating.
* A snapshot is the llama-server slot file followed by Werk's trailer (:mod:`.snapshot`): the
  exact prompt tokens, the acknowledged save counters and the tokens' keyed digest
  (:mod:`.integrity`). A save is kept only when the slot file's own token ids are exactly the
  prompt Werk evaluated (else a retryable ``unavailable``, nothing stored); a restore requires
  the slot file's token ids to equal the trailer's, the digest to verify under this adapter's
  key, and ``n_restored``/``n_read`` to equal the counters (``corrupt_state`` otherwise); the
  host verified the payload's size and SHA-256 before.
* Before state work the child must answer ``/health`` within :data:`HEALTH_TIMEOUT_S` (a
  stopped child is a retryable ``unavailable``, and is never probed).
* Compatibility (docs/states.md): a state's envelope is :meth:`LlamaCppAdapter.envelope`
  (executable and help SHA-256, the KV-relevant effective arguments, model identity and files,
  cache layout). The process generation is not part of it: a state written by an earlier
  generation is restored when the envelope is exactly equal, the payload verifies and the
  acknowledgements are exact, and only by a generation whose functional probe passed. Only such
  a generation reports the state, prefill/decode and cross-restart capabilities as
  ``experimental``. Handoffs and live slot contents still die with their generation.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import secrets
import threading
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from werk_host.plugin import (
    CapabilityId,
    CapabilityReport,
    ChatLimits,
    ChatRequest,
    DecodeOutput,
    DecodeWork,
    DeploymentPlan,
    EndpointKind,
    ErrorCode,
    HostConfig,
    MessagesInput,
    ModelManifest,
    PrefilledState,
    PrefillWork,
    Snapshot,
    StoredStateRef,
    WerkError,
    WorkerObservation,
)
from werk_host.plugin.http import post_json

from .binary import LlamaServerNotFound, find_llama_server
from .capabilities import capability_reports
from .integrity import key_id, load_key, path_tokens, tokens_digest, tokens_equal
from .native import LlamaServerClient, NativeConnectionError, NativeError, NativeHTTPError
from .probe import ProbeResult, run_probe
from .process import LlamaServerProcess, LlamaServerStartupError, last_flag_value
from .proxy import LlamaConnectionPool as ConnectionPool
from .slots import SlotRouter, ordinary_capacity
from .snapshot import SlotImage, presented, read_image, verify_tokens

#: ChatRequest fields that do not reach the template: left out of a counted body.
_NOT_COUNTED: set[str] = {"werk", "stream", "model"}

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
_MEDIA_FLAGS = ("-mm", "--mmproj", "-mmu", "--mmproj-url")
_SECRET_FLAGS = ("--api-key", "--api-key-file", "--ssl-key-file", "--hf-token", "-hft")


@dataclass
class LlamaHandle:
    """A prefilled state: its exact prompt tokens (and their keyed digest), producing generation
    and local snapshot."""

    token: str
    tokens: list[int]
    generation: str
    n_saved: int
    n_written: int
    tokens_hmac: str
    snapshot: Path | None = field(default=None, repr=False)

    def __repr__(self) -> str:
        return f"LlamaHandle(tokens={len(self.tokens)}, generation={self.generation[:8]})"


def own_handle(handle: object) -> LlamaHandle:
    """``handle`` as this adapter's own type (the host hands back only what prefill returned)."""
    if not isinstance(handle, LlamaHandle):
        raise WerkError(ErrorCode.INTERNAL, "the host passed a state handle this adapter did not create")
    return handle


def model_files_fingerprint(manifest: ModelManifest) -> str:
    """SHA-256 over the size and modification time of every model file, as found now.

    The manifest identity records each file's SHA-256 at install time; this dimension also
    tells apart a file replaced in place afterwards (the weights a process loaded)."""
    try:
        prints = [[st.st_size, st.st_mtime_ns] for st in (os.stat(f.path) for f in manifest.files)]
    except OSError as err:
        raise _unavailable("a model file of this manifest cannot be read") from err
    return hashlib.sha256(json.dumps(prints, separators=(",", ":")).encode()).hexdigest()


def mismatch_fields(expected: dict[str, str], found: dict[str, str]) -> list[str]:
    """The envelope dimensions whose values differ (or exist on one side only)."""
    return sorted(k for k in set(expected) | set(found) if expected.get(k) != found.get(k))


def _unavailable(message: str) -> WerkError:
    return WerkError(ErrorCode.UNAVAILABLE, message, retryable=True)


class LlamaCppAdapter:
    """Adapter for one installed GGUF model served by a Werk-managed ``llama-server``."""

    backend = BACKEND_ID
    plugin_name = PLUGIN_NAME

    def __init__(self, config: HostConfig, manifest: ModelManifest, options: dict[str, Any] | None = None) -> None:
        opts = dict(options or {})
        self.config = config
        self.manifest = manifest
        self.instance_id = f"llamacpp:{manifest.name}"
        self.binary_path = find_llama_server(opts.get("llama_server"))
        self.parallel = int(opts.get("parallel", 2))
        self.ctx = int(opts.get("ctx", 4096 * self.parallel))
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
        self._slot_owner: str | None = None
        self._count_cache: OrderedDict[str, int] = OrderedDict()
        self._proxy_pools: dict[str, ConnectionPool] = {}
        self._limits: tuple[tuple[str | None, str | None], ChatLimits] | None = None
        self.last_decode: dict[str, Any] = {}
        self.closed = False

    # -- process lifecycle ---------------------------------------------------------------
    def process(self) -> LlamaServerProcess:
        """The live child, starting a fresh one (new generation) when none is alive."""
        with self._life:
            if self.closed:
                raise _unavailable("the llama.cpp adapter is shut down")
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
            )
            try:
                proc.start()
            except LlamaServerStartupError as err:
                log.error("llama-server failed to start: %s\n%s", err, err.log_tail)
                tail = "\n".join(err.log_tail.splitlines()[-12:])
                raise WerkError(
                    ErrorCode.UNAVAILABLE, f"llama-server failed to start; native log tail:\n{tail}", retryable=False
                ) from err
            self._model_files[proc.generation] = model_files  # before any reader can see proc
            self._process = proc
            return proc

    def _extra_args(self) -> list[str]:
        """``--metrics`` (child counters for observability) and ``--alias`` (the API reports the
        manifest name, never the model's file path), each only when the help advertises it."""
        args: list[str] = []
        if self._advertises("--metrics"):
            args.append("--metrics")
        if self._advertises("--alias"):
            args += ["--alias", self.manifest.name]
        return args

    def _advertises(self, flag: str) -> bool:
        from .binary import inspect_executable

        return inspect_executable(self.binary_path).advertises(flag)

    def current(self) -> LlamaServerProcess | None:
        proc = self._process
        return proc if proc is not None and proc.alive() else None

    def identity(self) -> str:
        proc = self.current()
        return f"{self.instance_id}#{proc.generation if proc else 'none'}"

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
            return _unavailable(f"llama-server stopped answering during {what}")
        if isinstance(err, NativeHTTPError) and err.status == 503:
            return _unavailable(f"llama-server is busy or loading; {what} did not run")
        return WerkError(ErrorCode.INTERNAL, f"llama-server {what} failed")

    # -- evidence ------------------------------------------------------------------------
    def envelope(self, proc: LlamaServerProcess) -> dict[str, str]:
        """The compatibility envelope of states ``proc`` writes and may restore: every dimension
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
            raise _unavailable("llama-server is not ready")

    def producer_envelope(self, model_id: str) -> dict[str, str]:
        """:meth:`envelope` of the live process, unless none runs for ``model_id`` or its
        functional probe failed (then no state is reusable: ``unavailable``). Before the probe
        has run the envelope is reported; decode runs the probe before any restore."""
        proc = self.current()
        if proc is None or model_id != self.manifest.name:
            raise _unavailable("no live llama-server for this model")
        probe = self._probes.get(proc.generation)
        if probe is not None and not probe.passed:
            raise _unavailable("the functional slot probe failed for this llama-server generation")
        return self.envelope(proc)

    def probe_result(self) -> ProbeResult | None:
        proc = self.current()
        return self._probes.get(proc.generation) if proc else None

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
            raise _unavailable(f"llama.cpp named state is unavailable: the functional probe failed ({result.reason})")

    # -- prefill / snapshot / restore / decode -------------------------------------------
    def render_prompt(self, client: LlamaServerClient, work: PrefillWork) -> list[int]:
        if isinstance(work.input, MessagesInput):
            text = client.apply_template([m.model_dump(mode="json") for m in work.input.messages])
        else:
            text = work.input.text
        return client.tokenize(text, add_special=True, parse_special=isinstance(work.input, MessagesInput))

    def prefill(self, work: PrefillWork) -> PrefilledState:
        if work.model_id != self.manifest.name:
            raise WerkError(ErrorCode.NOT_FOUND, "model is not served by this adapter")
        with self.slot_lock:
            proc = self.process()
            self.check_answering(proc)
            self.ensure_probed(proc)
            client, slot = self.client(proc), self.state_slot
            try:
                tokens = self.render_prompt(client, work)
                slot_ctx = self.context_per_slot(proc)
                if slot_ctx is not None and len(tokens) >= slot_ctx:
                    raise WerkError(
                        ErrorCode.RESOURCE_EXHAUSTED,
                        f"prompt has {len(tokens)} tokens; a slot holds {slot_ctx}",
                        retryable=False,
                    )
                done = client.completion(
                    tokens, id_slot=slot, n_predict=0, cache_prompt=True, timeout=STATE_WORK_TIMEOUT_S
                )
                if done.tokens_evaluated != len(tokens):
                    raise _unavailable("llama-server evaluated a different prompt length; retry")
                token = secrets.token_hex(16)
                filename = f"werk-state-{token}.bin"
                saved = client.slot_save(slot, filename)
            except NativeError as err:
                self._slot_owner = None
                raise self.native_failure(err, "prefill") from err
            self._slot_owner = token
            assert proc.slot_dir is not None
            path = proc.slot_dir / filename
            try:
                held = path_tokens(path, saved.n_written) if os.lstat(path).st_size == saved.n_written else None
            except (OSError, WerkError):
                held = None
            if saved.n_saved != len(tokens) or held != tokens:
                # Never stored: the slot file does not hold exactly the prompt Werk evaluated.
                path.unlink(missing_ok=True)
                self._slot_owner = None
                log.error("llama-server saved a slot that does not hold the prefilled prompt; nothing is stored")
                raise _unavailable("the state slot did not hold the prefilled prompt when it was saved; retry")
            digest = tokens_digest(self.token_key, tokens)
            handle = LlamaHandle(token, tokens, proc.generation, saved.n_saved, saved.n_written, digest, path)
            return PrefilledState(
                handle=handle,
                prompt_tokens=len(tokens),
                envelope=self.envelope(proc),
                snapshot_capable=True,
                bytes=saved.n_written,
                adapter_meta={
                    "n_tokens": saved.n_saved,
                    "n_bytes": saved.n_written,
                    "producer_generation": proc.generation,
                    "tokens_hmac": digest,
                },
            )

    def snapshot(self, state: PrefilledState) -> Snapshot:
        """The state's slot file followed by Werk's trailer (:mod:`.snapshot`), streamed."""
        handle = own_handle(state.handle)
        if handle.snapshot is None:
            raise WerkError(ErrorCode.UNAVAILABLE, "the state's local snapshot is gone", retryable=False)
        trailer = SlotImage(handle.tokens, handle.n_saved, handle.n_written, handle.tokens_hmac).trailer()
        path = handle.snapshot

        def chunks() -> Iterator[bytes]:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd, "rb") as source:
                while chunk := source.read(CHUNK):
                    yield chunk
            yield trailer

        def close() -> None:
            # The store now owns the bytes; decode restores from it if the slot moved on.
            path.unlink(missing_ok=True)
            handle.snapshot = None

        return Snapshot(chunks=chunks(), size=handle.n_written + len(trailer), close=close)

    def restore_slot_file(self, proc: LlamaServerProcess, name: str, n_saved: int, n_written: int) -> str:
        """Restore the slot file ``name`` (in the private slot directory) into the state slot and
        require the exact acknowledgement; returns the new slot owner token.

        A rejected or mis-acknowledged snapshot is ``corrupt_state`` (the slot is erased); a dead
        child is ``unavailable``. (llama-server defers a restore on a busy slot until it is idle.)"""
        client, slot = self.client(proc), self.state_slot
        self._slot_owner = None
        try:
            restored = client.slot_restore(slot, name)
        except NativeError as err:
            with contextlib.suppress(NativeError):
                client.slot_erase(slot)
            if isinstance(err, NativeConnectionError):
                raise self.native_failure(err, "restore") from err
            raise WerkError(ErrorCode.CORRUPT_STATE, "llama-server rejected the snapshot") from err
        if restored.n_restored != n_saved or restored.n_read != n_written:
            with contextlib.suppress(NativeError):
                client.slot_erase(slot)
            raise WerkError(ErrorCode.CORRUPT_STATE, "restore acknowledgement does not match the snapshot")
        token = secrets.token_hex(16)
        self._slot_owner = token
        return token

    def _restore_stored(self, proc: LlamaServerProcess, stored: StoredStateRef) -> LlamaHandle:
        """Restore a stored state, whichever generation wrote it, into the state slot.

        The caller holds the slot lock and ran :meth:`ensure_probed` for ``proc``. Requires the
        stored compatibility envelope to equal this process's exactly (``incompatible_state``
        with ``mismatch_fields`` otherwise); the payload arrives size- and SHA-256-verified from
        the store; its trailer must add up and llama-server's acknowledgement must be exact
        (``corrupt_state`` otherwise). The verified bytes are handed over without a copy where
        the platform allows (:func:`.snapshot.presented`). Before llama-server reads it, the slot
        file's token ids must equal the trailer's, the trailer's digest must verify under this
        adapter's key and equal the one recorded at commit (``corrupt_state`` otherwise)."""
        expected = self.envelope(proc)
        if stored.envelope != expected:
            raise WerkError(
                ErrorCode.INCOMPATIBLE_STATE,
                "the stored state was written for a different llama-server configuration",
                details={"mismatch_fields": mismatch_fields(expected, stored.envelope)},
            )
        assert proc.slot_dir is not None
        with stored.open_payload() as payload:
            fd = payload.fileno()
            image = read_image(fd, os.fstat(fd).st_size)
            verify_tokens(fd, image, self.token_key)
            recorded = stored.adapter_meta.get("tokens_hmac")
            if recorded is not None and recorded != image.tokens_hmac:
                raise WerkError(
                    ErrorCode.CORRUPT_STATE, "the snapshot's token digest is not the one recorded at commit"
                )
            with presented(proc.slot_dir, fd, image.n_written) as name:
                token = self.restore_slot_file(proc, name, image.n_saved, image.n_written)
        return LlamaHandle(token, image.tokens, proc.generation, image.n_saved, image.n_written, image.tokens_hmac)

    def _check_local(self, handle: LlamaHandle, path: Path) -> None:
        """``corrupt_state`` unless the local slot file holds exactly the handle's tokens, whose
        digest is the one recorded when it was saved."""
        try:
            held = path_tokens(path, handle.n_written)
        except OSError as err:
            raise _unavailable("the state's local snapshot is gone") from err
        if held != handle.tokens or not tokens_equal(self.token_key, handle.tokens, handle.tokens_hmac):
            raise WerkError(ErrorCode.CORRUPT_STATE, "the local slot file holds other tokens than the state")

    def restore(self, stored: StoredStateRef) -> PrefilledState:
        with self.slot_lock:
            proc = self.process()
            self.check_answering(proc)
            self.ensure_probed(proc)
            handle = self._restore_stored(proc, stored)
            return PrefilledState(handle, len(handle.tokens), self.envelope(proc), True, bytes=handle.n_written)

    def decode(self, work: DecodeWork) -> DecodeOutput:
        """Generate from a handed-off state: the live slot when it still holds the state, else
        the state's local slot file (same generation), else the stored payload (any generation
        with an equal envelope, after this generation's probe passed)."""
        with self.slot_lock:
            proc = self.process()
            self.check_answering(proc)
            self.ensure_probed(proc)
            given = own_handle(work.handle) if work.handle is not None else None
            handle = given
            source = "live"
            if handle is None or handle.generation != proc.generation or handle.token != self._slot_owner:
                if handle is not None and handle.snapshot is not None and handle.generation == proc.generation:
                    self._check_local(handle, handle.snapshot)
                    token = self.restore_slot_file(proc, handle.snapshot.name, handle.n_saved, handle.n_written)
                    handle = LlamaHandle(
                        token, handle.tokens, proc.generation, handle.n_saved, handle.n_written, handle.tokens_hmac
                    )
                    source = "local"
                elif work.stored is not None:
                    handle = self._restore_stored(proc, work.stored)
                    source = "stored"
                else:
                    raise _unavailable("the live state is gone and no snapshot exists")
            opts = work.options
            try:
                done = self.client(proc).completion(
                    handle.tokens,
                    id_slot=self.state_slot,
                    n_predict=opts.max_tokens,
                    cache_prompt=True,
                    temperature=opts.temperature,
                    top_p=opts.top_p,
                    seed=opts.seed,
                    stop=list(opts.stop) or None,
                    timeout=STATE_WORK_TIMEOUT_S,
                )
            except NativeError as err:
                raise self.native_failure(err, "decode") from err
            finally:
                self._slot_owner = None  # the slot now also holds generated tokens
                if given is not None and given.snapshot is not None:
                    given.snapshot.unlink(missing_ok=True)
                    given.snapshot = None
            self.last_decode = {
                "restored": source != "live",
                "source": source,
                "prompt_tokens": len(handle.tokens),
                "cache_n": done.cache_n,
                "prompt_n": done.prompt_n,
                "predicted_n": done.predicted_n,
            }
            return DecodeOutput(
                text=done.content,
                completion_tokens=done.predicted_n or 0,
                finish_reason=done.finish_reason or "stop",
            )

    def release(self, handle: object) -> bool:
        if isinstance(handle, LlamaHandle) and handle.snapshot is not None:
            handle.snapshot.unlink(missing_ok=True)
            handle.snapshot = None
            return True
        return False

    # -- chat planning -------------------------------------------------------------------
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

    def plan(self) -> DeploymentPlan | None:
        """The running child's resolved placement, from its actual argv (``None`` when none runs).
        Filesystem paths and the values of secret-bearing flags become placeholders."""
        proc = self.current()
        if proc is None:
            return None
        argv = proc.argv[1:]
        shown: list[str] = []
        for i, arg in enumerate(argv):
            if i > 0 and argv[i - 1] in _SECRET_FLAGS:
                shown.append("<redacted>")
            elif os.path.isabs(arg) or os.sep in arg and os.path.exists(arg):
                shown.append("<path>")
            else:
                shown.append(arg)
        threads = last_flag_value(argv, ("-t", "--threads"))
        layers = last_flag_value(argv, ("-ngl", "--gpu-layers", "--n-gpu-layers"))
        offloaded = int(layers) if layers is not None and layers.lstrip("-").isdigit() else 0
        return DeploymentPlan(
            endpoint=EndpointKind.LOCAL,
            arguments=shown,
            threads=int(threads) if threads is not None and threads.isdigit() else None,
            parallel_slots=proc.effective_parallel() if proc.effective_parallel() > 0 else None,
            context_per_slot=self.context_per_slot(proc),
            device="cpu" if offloaded == 0 else f"gpu ({offloaded} layers offloaded)",
        )

    def chat_limits(self, model: str | None) -> ChatLimits:
        """The limits the running child's launch arguments and the manifest set; kept per
        (process generation, model), since neither changes while a child runs."""
        proc = self.current()
        key = (proc.generation if proc is not None else None, model)
        kept = self._limits
        if kept is not None and kept[0] == key:
            return kept[1]
        context = self.context_per_slot(proc)
        ceilings = [c for c in (self.manifest.output_ceiling(), context - 1 if context else None) if c]
        parallel = proc.effective_parallel() if proc is not None else 0
        limits = ChatLimits(
            model=model or self.manifest.name,
            context_tokens=context,
            max_output_tokens=min(ceilings) if ceilings else None,
            # the ordinary slots (:mod:`.slots`): the state slot never serves ordinary traffic
            max_concurrent_requests=ordinary_capacity(parallel) if parallel > 0 else None,
        )
        self._limits = (key, limits)
        return limits

    @staticmethod
    def accepts_media(proc: LlamaServerProcess) -> bool:
        """Whether the child was launched with a multimodal projector (image/audio parts)."""
        return last_flag_value(proc.argv[1:], _MEDIA_FLAGS) is not None

    def count_tokens(self, request: ChatRequest) -> int:
        # the cache key: the JSON of the very body counted (equal bodies serialize equally)
        key = hashlib.sha256(request.model_dump_json(exclude_none=True, exclude=_NOT_COUNTED).encode()).hexdigest()
        with self._life:
            if key in self._count_cache:
                self._count_cache.move_to_end(key)
                return self._count_cache[key]
        proc = self.process()
        if not self.accepts_media(proc) and any(
            part.type != "text" for m in request.messages if isinstance(m.content, list) for part in m.content
        ):
            # llama-server answers 500 for this; it is the request that does not fit the model.
            raise WerkError(ErrorCode.INVALID_REQUEST, "this model accepts text content parts only")
        pool = self.proxy_pool(proc)  # keep-alive connections: no TCP setup per count
        body = request.model_dump(mode="json", exclude_none=True, exclude=_NOT_COUNTED)
        try:
            text = post_json(pool, "/apply-template", body)["prompt"]
            tokens = post_json(pool, "/tokenize", {"content": text, "add_special": True, "parse_special": True})
            count = len(tokens["tokens"])
        except WerkError as err:
            if err.code is ErrorCode.INVALID_REQUEST:
                raise
            raise _unavailable("llama-server could not count this request") from err
        except (KeyError, TypeError) as err:
            raise _unavailable("llama-server could not count this request") from err
        with self._life:
            self._count_cache[key] = count
            while len(self._count_cache) > 256:
                self._count_cache.popitem(last=False)
        return count

    def workers(self) -> list[WorkerObservation]:
        proc = self.current()
        if proc is None:
            return []
        client = proc.new_client(timeout=self.config.backend_bounds.call_s)  # --backend-timeout
        try:
            slots = client.slots()
        except NativeError:
            slots = []
        finally:
            client.close()
        sizes = [s.n_ctx for s in slots if isinstance(s.n_ctx, int) and s.n_ctx > 0]
        valid = bool(slots) and len(sizes) == len(slots)
        return [
            WorkerObservation(
                model=self.manifest.name,
                backend=BACKEND_ID,
                pid=proc.pid,
                state="running",
                slots=len(slots) if slots else None,
                context_per_request_tokens=min(sizes) if valid else None,
                context_capacity_tokens=sum(sizes) if valid else None,
            )
        ]

    def proxy_pool(self, proc: LlamaServerProcess) -> ConnectionPool:
        with self._life:
            pool = self._proxy_pools.get(proc.generation)
            if pool is None:
                pool = ConnectionPool(
                    proc.host, proc.port or 0, api_key=proc.api_key, bounds=self.config.backend_bounds
                )
                self._proxy_pools[proc.generation] = pool
            return pool

    def forget_slot(self) -> None:
        """Something other than state work may have used the state slot."""
        self._slot_owner = None


#: What ``werk serve`` says when no llama-server is found (no path: it may reach an error body).
LLAMA_SERVER_MISSING = (
    "llama-server not found: run `werk llamacpp build` (builds and caches it once), "
    "or set WERK_LLAMA_SERVER to an executable llama-server, or put llama-server on PATH"
)


def create_adapter(config: HostConfig, manifest: ModelManifest | None) -> LlamaCppAdapter:
    if manifest is None:
        raise WerkError(ErrorCode.INVALID_REQUEST, "the llama.cpp backend needs a model")
    options = dict(config.backend_options.get(PLUGIN_NAME, {}))
    try:
        adapter = LlamaCppAdapter(config, manifest, options)
    except LlamaServerNotFound as err:
        raise WerkError(ErrorCode.UNAVAILABLE, LLAMA_SERVER_MISSING, retryable=False) from err
    adapter.process()  # residency: the child starts with werk serve
    return adapter


def accepts(manifest: ModelManifest | None) -> bool:
    if manifest is None:
        return False
    if manifest.backend is not None:
        return manifest.backend in (BACKEND_ID, PLUGIN_NAME)
    try:
        with open(manifest.primary_path, "rb") as handle:
            return handle.read(4) == b"GGUF"
    except OSError:
        return False
