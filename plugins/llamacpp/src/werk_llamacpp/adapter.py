"""The llama.cpp adapter: one managed ``llama-server`` per model, probed slot state.

State model (docs/architecture.md, "llama.cpp slot use" and "Snapshot format of llama.cpp states"):

* One slot, the last one (``state_slot``), is where Werk prefills, restores and decodes
  named states; the functional probe runs there too. A lock serializes that work.
* A prefilled state's live copy is whatever the state slot holds. Because ``/v1`` traffic may
  land on any idle slot, the adapter remembers which handle the slot holds (``_slot_owner``)
  and forgets it whenever anything else may have used the slot; decode then restores the
  state from its snapshot before generating, so correctness never depends on luck.
* A snapshot is ``MAGIC | u32 header length | JSON header | llama-server slot file``. The
  header carries the exact prompt tokens and the acknowledged save counters; restore requires
  ``n_restored``/``n_read`` to equal them, and the host verified the SHA-256 before.
* Only a process generation whose functional probe passed reports the state and prefill/decode
  capabilities as ``experimental``; snapshots of other generations are never restored.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import secrets
import struct
import threading
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from werk_host.backend import (
    CapabilityReport,
    DecodeOutput,
    DecodeWork,
    PrefilledState,
    PrefillWork,
    Snapshot,
    StoredStateRef,
)
from werk_host.backends.relay import post_json
from werk_host.config import HostConfig
from werk_host.errors import ErrorCode, WerkError
from werk_host.models import ModelManifest
from werk_host.protocol import (
    CapabilityId,
    CapabilityStatus,
    ChatLimits,
    ChatRequest,
    DeploymentPlan,
    EndpointKind,
    MessagesInput,
    WorkerObservation,
)

from .binary import LlamaServerNotFound, find_llama_server
from .native import LlamaServerClient, NativeConnectionError, NativeError
from .probe import ProbeResult, run_probe
from .process import LlamaServerProcess, LlamaServerStartupError, last_flag_value
from .proxy import LlamaConnectionPool as ConnectionPool

log = logging.getLogger(__name__)

BACKEND_ID = "llama.cpp"
PLUGIN_NAME = "llamacpp"
CACHE_LAYOUT = "werk-llamacpp-slot-v1"
MAGIC = b"WERKLCPP1\n"
MAX_HEADER_BYTES = 16 << 20
CHUNK = 1 << 20
_CTX_FLAGS = ("-c", "--ctx-size")
_MEDIA_FLAGS = ("-mm", "--mmproj", "-mmu", "--mmproj-url")
_SECRET_FLAGS = ("--api-key", "--api-key-file", "--ssl-key-file", "--hf-token", "-hft")

STATE_CAPABILITIES = (
    CapabilityId.PREFIX_CACHE,
    CapabilityId.PERSISTENCE,
    CapabilityId.RESTORE,
    CapabilityId.TIER_DISK,
    CapabilityId.PD_PREFILL,
    CapabilityId.PD_DECODE,
    CapabilityId.PD_HANDOFF,
)
CHAT_CAPABILITIES = (
    (CapabilityId.TOKEN_COUNT, "exact count from llama-server's /apply-template and /tokenize"),
    (CapabilityId.ADMISSION, "native count from llama-server, estimate when it is unavailable"),
    (CapabilityId.CHAT_LIMITS, "from the manifest and the child's launch arguments"),
    (CapabilityId.REASONING, "verified only from running launch configuration"),
)
#: Every id :meth:`LlamaCppAdapter.capabilities` reports on (declared on the adapter factory).
REPORTED_CAPABILITIES = (
    CapabilityId.MODEL_RESIDENCY,
    *STATE_CAPABILITIES,
    CapabilityId.CROSS_RESTART,
    CapabilityId.TIER_RAM,
    CapabilityId.TIER_VRAM,
    CapabilityId.EXPERTS,
    *(cap_id for cap_id, _ in CHAT_CAPABILITIES),
)


class Reader(Protocol):
    def read(self, n: int = -1, /) -> bytes: ...


@dataclass
class LlamaHandle:
    """A prefilled state: its exact prompt tokens, producing generation and local snapshot."""

    token: str
    tokens: list[int]
    generation: str
    n_saved: int
    n_written: int
    snapshot: Path | None = field(default=None, repr=False)

    def __repr__(self) -> str:
        return f"LlamaHandle(tokens={len(self.tokens)}, generation={self.generation[:8]})"


def own_handle(handle: object) -> LlamaHandle:
    """``handle`` as this adapter's own type (the host hands back only what prefill returned)."""
    if not isinstance(handle, LlamaHandle):
        raise WerkError(ErrorCode.INTERNAL, "the host passed a state handle this adapter did not create")
    return handle


def snapshot_head(handle: LlamaHandle) -> bytes:
    """``MAGIC | u32 length | JSON header`` preceding the slot file bytes in a snapshot."""
    header = json.dumps(
        {"tokens": handle.tokens, "n_saved": handle.n_saved, "n_written": handle.n_written}, separators=(",", ":")
    ).encode()
    return MAGIC + struct.pack(">I", len(header)) + header


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
        self.warmup_tokens = int(opts.get("warmup_tokens", 0))
        self.work_dir = config.home / "backends" / "llamacpp"
        self._life = threading.RLock()
        self._slot_lock = threading.Lock()
        self._process: LlamaServerProcess | None = None
        self._probes: dict[str, ProbeResult] = {}
        self._slot_owner: str | None = None
        self._count_cache: OrderedDict[str, int] = OrderedDict()
        self._proxy_pools: dict[str, ConnectionPool] = {}
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
        return WerkError(ErrorCode.INTERNAL, f"llama-server {what} failed")

    # -- evidence ------------------------------------------------------------------------
    def envelope(self, proc: LlamaServerProcess) -> dict[str, str]:
        prints = proc.fingerprints()
        return {
            "backend": BACKEND_ID,
            "executable_sha256": prints["executable_sha256"],
            "help_sha256": prints["help_sha256"],
            "args_sha256": prints["args_sha256"],
            "model_identity": self.manifest.identity,
            "cache_layout": CACHE_LAYOUT,
            "generation": prints["generation"],
        }

    def probe_result(self) -> ProbeResult | None:
        proc = self.current()
        return self._probes.get(proc.generation) if proc else None

    def capabilities(self) -> dict[CapabilityId, CapabilityReport]:
        proc = self.current()
        probe = self._probes.get(proc.generation) if proc else None
        reports: dict[CapabilityId, CapabilityReport] = {}
        if proc is not None:
            reports[CapabilityId.MODEL_RESIDENCY] = CapabilityReport(
                CapabilityStatus.SUPPORTED, "weights stay loaded in the managed llama-server while werk serve runs"
            )
        else:
            reports[CapabilityId.MODEL_RESIDENCY] = CapabilityReport(
                CapabilityStatus.UNAVAILABLE, "no live llama-server child; the next request starts one"
            )
        if probe is not None and probe.passed:
            state = CapabilityReport(
                CapabilityStatus.EXPERIMENTAL,
                "functional slot probe passed for this llama-server generation; snapshots are usable only by it",
            )
        elif probe is not None:
            state = CapabilityReport(
                CapabilityStatus.UNAVAILABLE, f"functional slot probe failed for this generation: {probe.reason}"
            )
        else:
            state = CapabilityReport(
                CapabilityStatus.UNAVAILABLE,
                "the functional slot probe has not run for this llama-server generation; an opted-in prefill runs it",
                probe_on_use=True,
            )
        for cap_id in STATE_CAPABILITIES:
            reports[cap_id] = state
        reports[CapabilityId.CROSS_RESTART] = CapabilityReport(
            CapabilityStatus.UNAVAILABLE, "snapshots are restorable only by the llama-server generation that wrote them"
        )
        for tier in (CapabilityId.TIER_RAM, CapabilityId.TIER_VRAM):
            reports[tier] = CapabilityReport(
                CapabilityStatus.UNSUPPORTED, "llama.cpp named states persist to disk only"
            )
        reports[CapabilityId.EXPERTS] = CapabilityReport(
            CapabilityStatus.UNSUPPORTED, "llama.cpp exposes no expert residency control"
        )
        for cap_id, detail in CHAT_CAPABILITIES:
            reports[cap_id] = CapabilityReport(CapabilityStatus.SUPPORTED, detail)
        return reports

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
        with self._slot_lock:
            proc = self.process()
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
                done = client.completion(tokens, id_slot=slot, n_predict=0, cache_prompt=True)
                if done.tokens_evaluated != len(tokens):
                    raise WerkError(ErrorCode.INTERNAL, "llama-server evaluated a different prompt length")
                token = secrets.token_hex(16)
                filename = f"werk-state-{token}.bin"
                saved = client.slot_save(slot, filename)
            except NativeError as err:
                self._slot_owner = None
                raise self.native_failure(err, "prefill") from err
            self._slot_owner = token
            assert proc.slot_dir is not None
            path = proc.slot_dir / filename
            if saved.n_saved != len(tokens) or os.lstat(path).st_size != saved.n_written:
                path.unlink(missing_ok=True)
                raise WerkError(ErrorCode.INTERNAL, "llama-server's save acknowledgement does not match the slot")
            handle = LlamaHandle(token, tokens, proc.generation, saved.n_saved, saved.n_written, path)
            return PrefilledState(
                handle=handle,
                prompt_tokens=len(tokens),
                envelope=self.envelope(proc),
                snapshot_capable=True,
                bytes=saved.n_written,
                adapter_meta={"n_tokens": saved.n_saved, "n_bytes": saved.n_written},
            )

    def snapshot(self, state: PrefilledState) -> Snapshot:
        handle = own_handle(state.handle)
        if handle.snapshot is None:
            raise WerkError(ErrorCode.UNAVAILABLE, "the state's local snapshot is gone", retryable=False)
        head = snapshot_head(handle)
        path = handle.snapshot

        def chunks() -> Iterator[bytes]:
            yield head
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd, "rb") as source:
                while chunk := source.read(CHUNK):
                    yield chunk

        def close() -> None:
            # The store now owns the bytes; decode restores from it if the slot moved on.
            path.unlink(missing_ok=True)
            handle.snapshot = None

        size = len(head) + handle.n_written
        return Snapshot(chunks=chunks(), size=size, close=close)

    def _restore_from(self, proc: LlamaServerProcess, source: Reader) -> LlamaHandle:
        """Write a verified payload into the slot-save dir and restore it into the state slot."""
        if source.read(len(MAGIC)) != MAGIC:
            raise WerkError(ErrorCode.CORRUPT_STATE, "snapshot is not a llama.cpp Werk snapshot")
        (length,) = struct.unpack(">I", source.read(4))
        if length > MAX_HEADER_BYTES:
            raise WerkError(ErrorCode.CORRUPT_STATE, "snapshot header is too large")
        try:
            header = json.loads(source.read(length))
            tokens = [int(t) for t in header["tokens"]]
            n_saved, n_written = int(header["n_saved"]), int(header["n_written"])
        except (ValueError, KeyError, TypeError) as err:
            raise WerkError(ErrorCode.CORRUPT_STATE, "snapshot header is malformed") from err
        assert proc.slot_dir is not None
        token = secrets.token_hex(16)
        path = proc.slot_dir / f"werk-restore-{token}.bin"
        written = 0
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            with os.fdopen(fd, "wb") as target:
                while chunk := source.read(CHUNK):
                    written += len(chunk)
                    target.write(chunk)
            if written != n_written:
                raise WerkError(ErrorCode.CORRUPT_STATE, "snapshot length does not match its save acknowledgement")
            client, slot = self.client(proc), self.state_slot
            self._slot_owner = None
            try:
                restored = client.slot_restore(slot, path.name)
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
        finally:
            path.unlink(missing_ok=True)
        self._slot_owner = token
        return LlamaHandle(token, tokens, proc.generation, n_saved, n_written)

    def restore(self, stored: StoredStateRef) -> PrefilledState:
        with self._slot_lock:
            proc = self.process()
            self.ensure_probed(proc)
            if stored.envelope != self.envelope(proc):
                raise WerkError(ErrorCode.INCOMPATIBLE_STATE, "snapshot belongs to another llama-server generation")
            with stored.open_payload() as payload:
                handle = self._restore_from(proc, payload)
            return PrefilledState(handle, len(handle.tokens), self.envelope(proc), True, bytes=handle.n_written)

    def decode(self, work: DecodeWork) -> DecodeOutput:
        with self._slot_lock:
            proc = self.process()
            self.ensure_probed(proc)
            given = own_handle(work.handle) if work.handle is not None else None
            handle = given
            live = handle is not None and handle.generation == proc.generation and handle.token == self._slot_owner
            restored = False
            if not live:
                if handle is not None and handle.snapshot is not None and handle.generation == proc.generation:
                    with open(handle.snapshot, "rb") as raw:
                        handle = self._restore_from(proc, _prefixed(handle, raw))
                elif work.stored is not None:
                    if work.stored.envelope.get("generation") != proc.generation:
                        raise WerkError(ErrorCode.INCOMPATIBLE_STATE, "snapshot belongs to another generation")
                    with work.stored.open_payload() as payload:
                        handle = self._restore_from(proc, payload)
                else:
                    raise _unavailable("the live state is gone and no snapshot exists")
                restored = True
            assert handle is not None
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
                )
            except NativeError as err:
                raise self.native_failure(err, "decode") from err
            finally:
                self._slot_owner = None  # the slot now also holds generated tokens
                if given is not None and given.snapshot is not None:
                    given.snapshot.unlink(missing_ok=True)
                    given.snapshot = None
            self.last_decode = {
                "restored": restored,
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
        proc = self.current()
        context = self.context_per_slot(proc)
        ceilings = [c for c in (self.manifest.output_ceiling(), context - 1 if context else None) if c]
        return ChatLimits(
            model=model or self.manifest.name,
            context_tokens=context,
            max_output_tokens=min(ceilings) if ceilings else None,
            max_concurrent_requests=proc.effective_parallel() if proc and proc.effective_parallel() > 0 else None,
        )

    @staticmethod
    def accepts_media(proc: LlamaServerProcess) -> bool:
        """Whether the child was launched with a multimodal projector (image/audio parts)."""
        return last_flag_value(proc.argv[1:], _MEDIA_FLAGS) is not None

    def count_tokens(self, request: ChatRequest) -> int:
        body = request.model_dump(mode="json", exclude_none=True, exclude={"werk", "stream", "model"})
        key = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
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
        client = proc.new_client(timeout=5)
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
                pool = ConnectionPool(proc.host, proc.port or 0, api_key=proc.api_key)
                self._proxy_pools[proc.generation] = pool
            return pool

    def forget_slot(self) -> None:
        """Something other than state work may have used the state slot."""
        self._slot_owner = None


class _prefixed:
    """A reader presenting a local slot file as a snapshot payload (header + bytes)."""

    def __init__(self, handle: LlamaHandle, raw: Reader) -> None:
        self._head = snapshot_head(handle)
        self._raw = raw

    def read(self, n: int = -1) -> bytes:
        if not self._head:
            return self._raw.read(n)
        if n < 0:
            out, self._head = self._head, b""
            return out + self._raw.read()
        out, self._head = self._head[:n], self._head[n:]
        return out


def create_adapter(config: HostConfig, manifest: ModelManifest | None) -> LlamaCppAdapter:
    if manifest is None:
        raise WerkError(ErrorCode.INVALID_REQUEST, "the llama.cpp backend needs a model")
    options = dict(config.backend_options.get(PLUGIN_NAME, {}))
    try:
        adapter = LlamaCppAdapter(config, manifest, options)
    except LlamaServerNotFound as err:
        raise WerkError(
            ErrorCode.UNAVAILABLE, "llama-server not found: set WERK_LLAMA_SERVER or --backend-option", retryable=False
        ) from err
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
