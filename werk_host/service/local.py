"""The local control service: principals, policy, catalog, handoffs and delegation.

It implements :class:`werk_host.control.WerkControl` by combining the persistent store,
the handoff registry and the memory manager, and reaches the backend only through
operation hooks on the adapter of the request's instance: every operation that needs one
takes the request's :class:`~werk_host.service.scope.RequestScope` (its principal and
instance, resolved once by the HTTP layer). Named states live in
:mod:`werk_host.service.states`, chat planning in :mod:`werk_host.service.planning`.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from werk_host import __version__
from werk_host.deployments.instances import Instance
from werk_host.deployments.report import deployment_report
from werk_host.errors import ErrorCode, WerkError
from werk_host.hooks import needed
from werk_host.memory import MemoryManager
from werk_host.protocol import (
    MAX_COMPLETION_TEXT_BYTES,
    Admission,
    Capability,
    CapabilityId,
    CapabilityStatus,
    ChatLimits,
    ChatRequest,
    DecodeRequest,
    DecodeResult,
    DeploymentActionRequest,
    DeploymentActionResult,
    DeploymentLogs,
    Deployments,
    ExpertActionRequest,
    ExpertActionResult,
    ExpertListQuery,
    ExpertPage,
    FinishReason,
    MemoryReport,
    Observability,
    PersistenceMode,
    PrefillRequest,
    PrefillResult,
    ProtocolVersion,
    PruneRequest,
    PruneResult,
    ReasoningProfile,
    ReusePolicy,
    RuntimeInfo,
    StateActionRequest,
    StateActionResult,
    StateListQuery,
    StatePage,
    Tier,
    TokenCount,
    WorkerObservation,
)
from werk_host.seam import (
    Adapter,
    CapabilityReport,
    DecodeOptions,
    DecodeWork,
    MemoryOperation,
    PrefilledState,
    PrefillWork,
    StoredStateRef,
)
from werk_host.service.cache import Shared
from werk_host.service.cacheentries import PromptCacheEntries, PromptCacheOperations
from werk_host.service.capabilities import CapabilityResolver
from werk_host.service.counters import DEFAULT_INSTANCE, ChatStats, MetricsReading
from werk_host.service.cursors import CursorCodec
from werk_host.service.fleet import Fleet
from werk_host.service.gate import InferenceGate, state_seats
from werk_host.service.handoffs import HandoffRecord, HandoffRegistry, HandoffReservation
from werk_host.service.leases import MemoryLeases
from werk_host.service.planning import ChatPlanning
from werk_host.service.policy import gate, resolve_prefill_policy
from werk_host.service.principals import Authenticator, Principal
from werk_host.service.promptcache import PromptCaches, prompt_cache_budget
from werk_host.service.scope import RequestScope
from werk_host.service.states import StateCatalog
from werk_host.store import StateRecord, StateStore

log = logging.getLogger(__name__)

SERVICE_NAME = "werk-host"


def _now_ms() -> int:
    return int(time.time() * 1000)


def prompt_material(model_id: str, request: PrefillRequest) -> bytes:
    """Canonical bytes of (model, input) that a prompt fingerprint is computed over."""
    return json.dumps(
        {"model_id": model_id, "input": request.input.model_dump(mode="json")},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    ).encode("utf-8", "surrogatepass")


def mismatch_fields(expected: dict[str, str], found: dict[str, str]) -> list[str]:
    return sorted(k for k in set(expected) | set(found) if expected.get(k) != found.get(k))


class LocalControlService(PromptCacheOperations):
    """Transport-neutral implementation of every ``/werk/v1`` operation."""

    def __init__(
        self,
        *,
        fleet: Fleet,
        auth: Authenticator,
        store: StateStore,
        memory: MemoryManager,
        handoffs: HandoffRegistry | None = None,
        cursor_secret: bytes,
        gate: InferenceGate | None = None,
    ) -> None:
        self.fleet = fleet
        self.hooks = fleet.hooks
        self.auth = auth
        self.store = store
        self.memory_manager = memory
        fleet.memory = memory  # residency admits starts against the same telemetry
        self.handoffs = handoffs or HandoffRegistry(on_expire=self._release_expired_handle)
        # residency waits handoff_wait for an instance with live ones, then they expire
        fleet.live_handoffs = self.handoffs.live_for
        fleet.expire_handoffs = self.handoffs.expire_for
        self.cursors = CursorCodec(cursor_secret)
        self.chat_stats = ChatStats()
        #: automatic prompt caches of ordinary requests, which the inference service serves
        #: through (docs/prompt-cache.md)
        self.prompt_caches = PromptCaches(
            fleet.config.home, auth, self.hooks, self.chat_stats, prompt_cache_budget(fleet.config, fleet)
        )
        fleet.on_ready = self.prompt_caches.prewarm
        self.prompt_cache_entries = PromptCacheEntries(self.prompt_caches, fleet)
        #: ``werk serve``'s inference gate, which prefill and decode run inside
        #: (docs/operations.md, "Inference concurrency"); ``None`` for in-process callers.
        self.inference_gate = gate
        self.leases = MemoryLeases(memory, self.hooks)
        self.capability_resolver = CapabilityResolver(self.hooks, self._host_evidence)
        self.planning = ChatPlanning(fleet, self.hooks, self.capability_resolver)
        self.states = StateCatalog(
            store=store,
            hooks=self.hooks,
            resolver=self.capability_resolver,
            cursors=self.cursors,
            memory=memory,
            leases=self.leases,
            gate=self._gate,
        )

    # -- helpers -------------------------------------------------------------------------
    def _host_evidence(
        self, adapter: Adapter | None, instance: Instance | None
    ) -> dict[CapabilityId, CapabilityReport]:
        host_status, host_detail = self.memory_manager.host_telemetry_status()
        acc_status, acc_detail = self.memory_manager.accelerator_telemetry_status()
        model = instance.manifest if instance is not None else None
        bounded = bool(adapter and model and self.leases.requirement(adapter, MemoryOperation.LOAD, model.name))
        res_status, res_detail = self.memory_manager.reservations_status(bounded)
        return {
            CapabilityId.TELEMETRY_HOST: CapabilityReport(CapabilityStatus(host_status), host_detail),
            CapabilityId.TELEMETRY_ACCELERATOR: CapabilityReport(CapabilityStatus(acc_status), acc_detail),
            CapabilityId.RESERVATIONS: CapabilityReport(CapabilityStatus(res_status), res_detail),
            CapabilityId.PROMPT_CACHE: self.prompt_caches.report(
                adapter, instance.id if instance is not None else DEFAULT_INSTANCE
            ),
        }

    def _gate(
        self,
        scope: RequestScope,
        adapter: Adapter | None,
        cap_id: CapabilityId,
        opted_in: bool,
        *,
        read_only: bool = False,
    ) -> CapabilityReport:
        """Raise what ``cap_id``'s status implies for this use (:func:`gate`) of ``adapter``
        (the request's, started or not); a ``read_only`` use (a listing) also passes
        ``externally_managed``, which permits read-only telemetry."""
        report = self.capability_resolver.one(adapter, cap_id, scope.instance)
        if read_only and report.status is CapabilityStatus.EXTERNALLY_MANAGED:
            return report
        gate(cap_id, report.status, report.detail, opted_in, probe_on_use=report.probe_on_use)
        return report

    def _status(self, scope: RequestScope, adapter: Adapter | None, cap_id: CapabilityId) -> CapabilityStatus:
        return self.capability_resolver.one(adapter, cap_id, scope.instance).status

    def _release_expired_handle(self, record: HandoffRecord) -> None:
        if record.lease_key is not None and record.state_id is None:
            self.leases.release(record.lease_key)
        adapter = self._adapter_with_identity(record.adapter_identity)
        if record.handle is None or adapter is None:
            return
        try:
            self.hooks.release_state(adapter, record.handle)
        except Exception:  # release is best effort; the backend reclaims on its own terms
            log.warning("backend failed to release an expired handoff's live state", exc_info=True)

    def _adapter_with_identity(self, identity: str) -> Adapter | None:
        """The ready adapter a handoff was issued by, whichever instance holds it."""
        return next((a for a in self._ready_adapters() if a.identity() == identity), None)

    @staticmethod
    def _require_model(scope: RequestScope, model_id: str) -> None:
        if model_id not in scope.model_ids():
            raise WerkError(ErrorCode.NOT_FOUND, "model is not installed on this server")

    # -- discovery -----------------------------------------------------------------------
    def info(self, scope: RequestScope) -> RuntimeInfo:
        instance = scope.instance
        return RuntimeInfo(
            service=SERVICE_NAME,
            service_version=__version__,
            protocol=ProtocolVersion(),
            active_backend=instance.backend if instance else None,
        )

    def capabilities(self, scope: RequestScope) -> Shared[tuple[Capability, ...]]:
        return self.capability_resolver.listing(scope.adapter, scope.instance)

    def memory(self) -> MemoryReport:
        return MemoryReport.model_validate(self.memory_manager.report())

    def observability(self) -> Observability:
        workers: list[WorkerObservation] = []
        for adapter in self._ready_adapters():
            workers += self.hooks.workers(adapter) or []
        per_request = [w.context_per_request_tokens for w in workers if w.context_per_request_tokens is not None]
        capacity = [w.context_capacity_tokens for w in workers if w.context_capacity_tokens is not None]
        complete = bool(workers) and len(per_request) == len(workers) and len(capacity) == len(workers)
        return Observability(
            observed_at_unix_ms=_now_ms(),
            chat=self.chat_stats.read(),
            workers=workers,
            context_per_request_tokens=min(per_request) if complete else None,
            context_capacity_tokens=sum(capacity) if complete else None,
            memory=self.memory(),
        )

    def _ready_adapters(self) -> list[Adapter]:
        deployments = self.fleet.deployments
        candidates = [i.peek() for i in deployments.instances.values()] if deployments else [self.fleet.adapter]
        return [a for a in candidates if a is not None]

    def deployments(self) -> Deployments:
        if self.fleet.deployments is None:
            return Deployments(inventory=[], plans=[], slots=[])
        return deployment_report(self.fleet.deployments, self.hooks)

    def deployment_action(
        self, principal: Principal, instance_id: str, request: DeploymentActionRequest
    ) -> DeploymentActionResult:
        return self.fleet.act(principal, instance_id, request)

    def deployment_logs(self, principal: Principal, instance_id: str, lines: int) -> DeploymentLogs:
        return self.fleet.logs(principal, instance_id, lines)

    # -- states (werk_host/service/states.py) ------------------------------------------------
    def list_states(self, scope: RequestScope, query: StateListQuery) -> Shared[StatePage]:
        return self.states.list_states(scope, query)

    def state_action(self, scope: RequestScope, state_id: str, request: StateActionRequest) -> StateActionResult:
        return self.states.state_action(scope, state_id, request)

    def prune_states(self, principal: Principal, request: PruneRequest) -> PruneResult:
        return self.states.prune_states(principal, request)

    # -- experts -------------------------------------------------------------------------
    def list_experts(self, scope: RequestScope, query: ExpertListQuery) -> ExpertPage:
        self._gate(scope, scope.started(), CapabilityId.EXPERTS, query.allow_experimental, read_only=True)
        adapter = scope.require_adapter("expert residency")
        return needed(self.hooks.list_experts(adapter, query), "expert residency", adapter)

    def expert_action(self, scope: RequestScope, request: ExpertActionRequest) -> ExpertActionResult:
        self._gate(scope, scope.started(), CapabilityId.EXPERTS, request.allow_experimental)
        adapter = scope.require_adapter("expert residency")
        return needed(self.hooks.expert_action(adapter, request), "expert residency", adapter)

    # -- prefill / decode ----------------------------------------------------------------
    @contextmanager
    def _inference(self, scope: RequestScope) -> Iterator[Callable[[], None]]:
        """The block holds a gate ticket of the scope's principal: taken first (the host-wide
        and per-key bounds, refused at once, before a cold instance starts) and released exactly
        once however the block ends. Yields the call that seats the ticket on the instance's
        prefill/decode seats (:func:`~werk_host.service.gate.state_seats`, waiting in their
        queue), made once the request is validated and before any backend work. Without a gate
        both do nothing."""
        gate = self.inference_gate
        if gate is None:
            yield lambda: None
            return
        with gate.enter(scope.principal.id) as ticket:
            instance = scope.instance.id if scope.instance is not None else DEFAULT_INSTANCE
            yield lambda: ticket.seat(state_seats(instance), None)

    def prefill(self, scope: RequestScope, request: PrefillRequest) -> PrefillResult:
        """A prefill inside the inference gate (:meth:`_inference`)."""
        with self._inference(scope) as seat:
            return self._prefill(scope, request, seat)

    def _prefill(self, scope: RequestScope, request: PrefillRequest, seat: Callable[[], None]) -> PrefillResult:
        principal = scope.principal
        policy, opted_in = resolve_prefill_policy(request, self.fleet.config.persistence)
        started = scope.started()
        self._gate(scope, started, CapabilityId.PD_PREFILL, opted_in)
        self._gate(scope, started, CapabilityId.PD_HANDOFF, opted_in)
        adapter = scope.require_adapter("prefill")
        self._require_model(scope, request.model_id)
        mode = policy.mode
        if mode is PersistenceMode.MEMORY:
            statuses = [self._status(scope, adapter, t) for t in (CapabilityId.TIER_RAM, CapabilityId.TIER_VRAM)]
            if all(s in (CapabilityStatus.UNSUPPORTED, CapabilityStatus.METADATA_ONLY) for s in statuses):
                raise WerkError(ErrorCode.UNSUPPORTED, "memory mode needs an operational RAM or VRAM state tier")
        if mode is PersistenceMode.DISK:
            self._gate(scope, adapter, CapabilityId.PERSISTENCE, opted_in)
            self._gate(scope, adapter, CapabilityId.TIER_DISK, opted_in)

        seat()  # validated: wait for a seat before any handoff, storage or backend work
        reservation = self.handoffs.reserve(principal.id)
        with ExitStack() as cleanup:
            cleanup.callback(reservation.rollback)
            fingerprint = self.auth.prompt_fingerprint(principal, prompt_material(request.model_id, request))
            if policy.reuse is not ReusePolicy.DISABLED:
                reused = self._try_reuse(principal, adapter, request.model_id, fingerprint, policy.reuse, reservation)
                if reused is not None:
                    cleanup.pop_all()
                    return reused
            want_snapshot = mode in (PersistenceMode.DISK, PersistenceMode.AUTO)
            if want_snapshot:
                self.store.admit(principal.id)  # a key at its storage bound: 429 before backend work
            work = PrefillWork(model_id=request.model_id, input=request.input, want_snapshot=want_snapshot)
            memory = self.leases.reserve(adapter, MemoryOperation.LOAD, request.model_id)
            if memory is not None:
                cleanup.callback(memory.release)
            state = needed(self.hooks.prefill(adapter, work), "prefill", adapter)
            cleanup.callback(self._release_handle, adapter, state.handle)
            lease_key = f"handle:{secrets.token_hex(12)}"
            self.leases.commit(  # before anything is published: a disagreeing state is discarded
                memory, state.bytes, lease_key, lambda: self._release_handle(adapter, state.handle), owner=principal.id
            )
            cleanup.callback(self.leases.release, lease_key)
            state_id: str | None = None
            tier: Tier | None = None
            expires: int | None = None
            if mode is not PersistenceMode.EPHEMERAL:
                if want_snapshot and state.snapshot_capable:
                    record = self._persist(principal, adapter, request.model_id, state, fingerprint, policy)
                    state_id, tier, expires = record.id, Tier(record.tier), record.expires_unix_ms
                    lease_key = self.leases.rekey(lease_key, record.id)
                elif mode is PersistenceMode.DISK:
                    raise WerkError(ErrorCode.UNSUPPORTED, "disk mode needs a disk-persistable snapshot")
                else:
                    raise WerkError(
                        ErrorCode.UNSUPPORTED,
                        f"{mode.value} mode needs a named state tier this backend cannot retain",
                    )
            handoff = HandoffRecord(
                principal.id, adapter.identity(), request.model_id, state_id, handle=state.handle, lease_key=lease_key
            )
            secret = self.handoffs.issue(reservation, handoff)
            cleanup.pop_all()
            return PrefillResult(
                handoff=secret,
                state_id=state_id,
                prompt_tokens=state.prompt_tokens,
                reused=False,
                tier=tier,
                expires_unix_ms=expires,
            )
        raise AssertionError("unreachable")  # pragma: no cover

    def _release_handle(self, adapter: Adapter, handle: Any) -> None:
        if handle is not None:
            self.hooks.release_state(adapter, handle)

    def _try_reuse(
        self,
        principal: Principal,
        adapter: Adapter,
        model_id: str,
        fingerprint: str,
        reuse: ReusePolicy,
        reservation: HandoffReservation,
    ) -> PrefillResult | None:
        """Answer from the newest compatible stored state whose payload verifies, if any.

        Candidates are tried newest first; one that fails integrity validation is
        quarantined by the store and the next is tried. ``None`` lets ``prefer`` fall
        through to a fresh prefill; ``required`` never does: it is ``conflict`` (409) with
        ``details.reason == "corrupt_state"`` when a compatible candidate was corrupt, else
        ``incompatible_state`` when a candidate's compatibility key differs, else ``conflict``.
        """
        candidates = [c for c in self.store.find_by_fingerprint(principal.id, fingerprint) if c.model_id == model_id]
        compat_key = self.states.compat_key(adapter, model_id)
        compatible = [c for c in candidates if compat_key is not None and c.compat_key == compat_key]
        record, corrupt_seen = self._newest_intact(principal, compatible)
        if record is not None:
            secret = self.handoffs.issue(
                reservation, HandoffRecord(principal.id, adapter.identity(), model_id, record.id, handle=None)
            )
            return PrefillResult(
                handoff=secret,
                state_id=record.id,
                prompt_tokens=record.prompt_tokens or 0,
                reused=True,
                tier=Tier(record.tier),
                expires_unix_ms=record.expires_unix_ms,
            )
        if reuse is ReusePolicy.REQUIRED:
            if corrupt_seen:
                raise WerkError(
                    ErrorCode.CONFLICT,
                    "reuse is required but the compatible stored state failed integrity validation",
                    details={"reason": "corrupt_state"},
                )
            incompatible = [c for c in candidates if c.compat_key != compat_key]
            if incompatible and compat_key is not None:
                newest = max(incompatible, key=lambda c: (c.created_unix_ms, c.id))
                raise WerkError(
                    ErrorCode.INCOMPATIBLE_STATE,
                    "a stored state matches the prompt but its compatibility key differs",
                    details={"mismatch_fields": mismatch_fields(compat_key, newest.compat_key)},
                )
            raise WerkError(ErrorCode.CONFLICT, "reuse is required but no compatible state exists")
        return None

    def _newest_intact(self, principal: Principal, compatible: list[StateRecord]) -> tuple[StateRecord | None, bool]:
        """The newest of ``compatible`` whose payload verifies, and whether any failed to.

        A state that vanished since it was listed (pruned, expired) is skipped.
        """
        corrupt_seen = False
        for record in sorted(compatible, key=lambda c: (c.created_unix_ms, c.id), reverse=True):
            try:
                if self.store.verify(principal.id, record.id):
                    return record, corrupt_seen
            except WerkError as exc:
                if exc.code is not ErrorCode.NOT_FOUND:
                    raise
                continue
            corrupt_seen = True
        return None, corrupt_seen

    def _persist(
        self,
        principal: Principal,
        adapter: Adapter,
        model_id: str,
        state: PrefilledState,
        fingerprint: str,
        policy: Any,
    ) -> StateRecord:
        snapshot = needed(self.hooks.snapshot(adapter, state), "state snapshot", adapter)
        try:
            return self.store.commit(
                principal.id,
                model_id=model_id,
                backend=adapter.backend,
                compat_key=dict(state.compat_key),
                payload=snapshot.chunks,
                prompt_fingerprint=fingerprint,
                prompt_tokens=state.prompt_tokens,
                ttl_seconds=policy.ttl_seconds,
                pinned=policy.pin,
                adapter_meta={**state.adapter_meta, **snapshot.adapter_meta},
            )
        finally:
            snapshot.close()

    def decode(self, scope: RequestScope, request: DecodeRequest) -> DecodeResult:
        """A decode inside the inference gate (:meth:`_inference`), seated before its handoff is
        consumed: a refusal leaves the handoff usable (docs/protocol.md)."""
        with self._inference(scope) as seat:
            return self._decode(scope, request, seat)

    def _decode(self, scope: RequestScope, request: DecodeRequest, seat: Callable[[], None]) -> DecodeResult:
        principal = scope.principal
        self._gate(scope, scope.started(), CapabilityId.PD_DECODE, request.allow_experimental)
        adapter = scope.require_adapter("decode")
        seat()
        secret = request.handoff.get_secret_value()
        record, replacement = self.handoffs.consume(principal.id, secret, adapter.identity())
        with ExitStack() as cleanup:
            cleanup.callback(replacement.rollback)
            stored: StoredStateRef | None = None
            if record.state_id is not None:
                stored_record = self.states.record_or_404(principal, record.state_id)
                compat_key = self.states.compat_key(adapter, record.model_id)
                if compat_key is None or compat_key != stored_record.compat_key:
                    raise WerkError(
                        ErrorCode.INCOMPATIBLE_STATE,
                        "the stored state was produced by a different backend configuration",
                        details={"mismatch_fields": mismatch_fields(compat_key or {}, stored_record.compat_key)},
                    )
                stored = self.states.stored_ref(principal, stored_record)
            options = DecodeOptions(
                max_tokens=request.max_tokens,
                temperature=request.temperature,
                top_p=request.top_p,
                seed=request.seed,
                stop=tuple(request.stop or ()),
            )
            if record.state_id is None and record.lease_key is not None:
                cleanup.callback(self.leases.release, record.lease_key)  # the handoff was the lease
            try:
                output = needed(
                    self.hooks.decode(adapter, DecodeWork(record.handle, stored, options)), "decode", adapter
                )
            except WerkError as exc:
                if exc.code is ErrorCode.CORRUPT_STATE and stored is not None:
                    # The payload verified, yet the backend could not use it (or it did not
                    # verify): either way it must never be offered again.
                    self.store.condemn(principal.id, stored.state_id)
                raise
            if len(output.text.encode("utf-8", "surrogatepass")) > MAX_COMPLETION_TEXT_BYTES:
                raise WerkError(ErrorCode.RESOURCE_EXHAUSTED, "backend completion text exceeds 1 MiB")
            next_handoff: str | None = None
            if output.next_state is not None:
                cleanup.pop_all()
                next_handoff = self.handoffs.issue(
                    replacement,
                    HandoffRecord(  # the continuation carries the ephemeral lease on
                        principal.id,
                        adapter.identity(),
                        record.model_id,
                        None,
                        handle=output.next_state.handle,
                        lease_key=record.lease_key if record.state_id is None else None,
                    ),
                )
            try:
                finish = FinishReason(output.finish_reason)
            except ValueError:
                finish = FinishReason.STOP
            return DecodeResult(
                text=output.text,
                handoff=next_handoff,
                completion_tokens=output.completion_tokens,
                finish_reason=finish,
            )
        raise AssertionError("unreachable")  # pragma: no cover

    # -- chat planning (werk_host/service/planning.py) ------------------------------------
    def count_tokens(self, scope: RequestScope, request: ChatRequest) -> TokenCount:
        return self.planning.count_tokens(scope, request)

    def admission(self, scope: RequestScope, request: ChatRequest) -> Admission:
        return self.planning.admission(scope, request)

    def chat_limits(self, scope: RequestScope, model: str | None) -> ChatLimits:
        return self.planning.chat_limits(scope, model)

    def reasoning(self, scope: RequestScope, model: str | None, max_output_tokens: int) -> ReasoningProfile:
        return self.planning.reasoning(scope, model, max_output_tokens)

    # -- metrics -------------------------------------------------------------------------
    def metrics_reading(self) -> MetricsReading:
        """What ``GET /metrics`` reads at scrape time: live handoffs, the named states per tier
        (committed, readable and unexpired; staging and quarantine entries left out), instance
        states and the memory report."""
        states: dict[str, int] = {}
        state_bytes: dict[str, int] = {}
        for entry in self.store.inventory():
            if entry.kind != "state" or entry.invalid or entry.expired:
                continue
            states[Tier.DISK.value] = states.get(Tier.DISK.value, 0) + 1
            state_bytes[Tier.DISK.value] = state_bytes.get(Tier.DISK.value, 0) + (entry.bytes or 0)
        deployments = self.fleet.deployments
        instances = {i: s.value for i, s in deployments.states().items()} if deployments is not None else {}
        return MetricsReading(
            handoffs_live=self.handoffs.live_count(),
            memory=self.memory(),
            states=states,
            state_bytes=state_bytes,
            instances=instances,
            prompt_cache_bytes=self.prompt_caches.disk_bytes(),
        )
