"""What the llama.cpp adapter reports for each capability id (docs/states.md).

:func:`capability_reports` is :meth:`werk_llamacpp.adapter.LlamaCppAdapter.capabilities`:
model residency from whether a child runs; the state, prefill/decode and cross-restart
capabilities ``experimental`` only for a generation whose functional probe passed
(``unavailable`` before it ran, with ``probe_on_use``, and after it failed); RAM/VRAM tiers and
expert residency ``unsupported``; the chat capabilities ``supported``.
"""

from __future__ import annotations

from werk_host.plugin import CapabilityId, CapabilityReport, CapabilityStatus

from .probe import ProbeResult

__all__ = ["CHAT_CAPABILITIES", "REPORTED_CAPABILITIES", "STATE_CAPABILITIES", "capability_reports"]

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
    CapabilityId.EMBEDDINGS,
    CapabilityId.RERANK,
)


def capability_reports(running: bool, probe: ProbeResult | None) -> dict[CapabilityId, CapabilityReport]:
    """The reports for a child that runs (or not) and its generation's probe result, if any."""
    reports: dict[CapabilityId, CapabilityReport] = {}
    if running:
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
            "functional slot probe (prefill, save, erase, restore in Werk's snapshot format, replay) "
            "passed for this llama-server generation",
        )
        cross = CapabilityReport(
            CapabilityStatus.EXPERIMENTAL,
            "functional slot probe passed for this llama-server generation; a state an earlier generation "
            "wrote is restored only when its compatibility key (executable and help SHA-256, "
            "KV-relevant arguments, model identity and files, cache layout) is equal, its payload's size "
            "and SHA-256 verify and llama-server acknowledges exactly the saved tokens and bytes",
        )
    elif probe is not None:
        state = CapabilityReport(
            CapabilityStatus.UNAVAILABLE, f"functional slot probe failed for this generation: {probe.reason}"
        )
        cross = state
    else:
        state = CapabilityReport(
            CapabilityStatus.UNAVAILABLE,
            "the functional slot probe has not run for this llama-server generation; an opted-in prefill runs it",
            probe_on_use=True,
        )
        cross = state
    for cap_id in STATE_CAPABILITIES:
        reports[cap_id] = state
    reports[CapabilityId.CROSS_RESTART] = cross
    for tier in (CapabilityId.TIER_RAM, CapabilityId.TIER_VRAM):
        reports[tier] = CapabilityReport(CapabilityStatus.UNSUPPORTED, "llama.cpp named states persist to disk only")
    reports[CapabilityId.EXPERTS] = CapabilityReport(
        CapabilityStatus.UNSUPPORTED, "llama.cpp exposes no expert residency control"
    )
    for cap_id, detail in CHAT_CAPABILITIES:
        reports[cap_id] = CapabilityReport(CapabilityStatus.SUPPORTED, detail)
    for cap_id in (CapabilityId.EMBEDDINGS, CapabilityId.RERANK):
        reports[cap_id] = CapabilityReport(
            CapabilityStatus.UNSUPPORTED, "a chat instance: an instance with a pooling embeds (docs/embeddings.md)"
        )
    return reports
