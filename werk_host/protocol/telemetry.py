"""Memory and observability DTOs."""

from __future__ import annotations

from pydantic import Field

from werk_host.protocol.base import DataModel, Pressure, Topology


class TierMemory(DataModel):
    capacity_bytes: int | None
    available_bytes: int | None
    managed_bytes: int = Field(ge=0)
    reserved_bytes: int = Field(ge=0)
    pressure: Pressure


class MemoryCounters(DataModel):
    active_reservations: int = 0
    managed_allocations: int = 0
    pressure_actions_in_flight: int = 0
    completed_demotions: int = 0
    completed_evictions: int = 0
    failed_releases: int = 0
    orphaned_release_bytes: int = 0
    telemetry_errors: int = 0
    backend_cleanup_failures: int = 0
    backend_cleanup_latched: int = Field(0, ge=0, le=1)


class MemoryReport(DataModel):
    observed_at_unix_ms: int
    overall_pressure: Pressure
    topology: Topology
    host: TierMemory
    accelerator: TierMemory
    last_action_unix_ms: int | None
    counters: MemoryCounters


class ChatCounters(DataModel):
    requests_total: int = 0
    requests_active: int = 0
    requests_failed: int = 0
    requests_rejected: int = 0
    #: admitted with a lowered requested output (werk_host/service/inference.py, docs/compat.md)
    requests_clamped: int = 0
    prompt_tokens_total: int = 0
    completion_tokens_total: int = 0
    #: automatic prompt caches (werk_host/service/promptcache.py, docs/prompt-cache.md): restores
    #: the backend's counters confirmed, requests that found nothing usable or whose restore was
    #: not reused, the tokens restores saved, entries saved, and the time spent saving and restoring
    prompt_cache_hits: int = 0
    prompt_cache_misses: int = 0
    prompt_cache_restored_tokens: int = 0
    prompt_cache_saves: int = 0
    #: entries restored into a new process's slot before any request (docs/prompt-cache.md, "Warm start")
    prompt_cache_prewarms: int = 0
    prompt_cache_save_ms: int = 0
    prompt_cache_restore_ms: int = 0


class WorkerObservation(DataModel):
    model: str
    backend: str
    pid: int | None
    state: str
    slots: int | None
    context_per_request_tokens: int | None
    context_capacity_tokens: int | None
    #: from the backend's own metrics where it exports them (null when unknown)
    requests_running: int | None = None
    requests_waiting: int | None = None
    kv_cache_usage: float | None = None
    #: prefix-cache hits / queries since the worker started (null before any query)
    prefix_cache_hit_rate: float | None = None


class Observability(DataModel):
    observed_at_unix_ms: int
    chat: ChatCounters
    workers: list[WorkerObservation]
    context_per_request_tokens: int | None
    context_capacity_tokens: int | None
    memory: MemoryReport
