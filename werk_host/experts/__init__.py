"""The backend-neutral expert policy engine (docs/experts.md): hotness, pins, cooldowns, claims and plans."""

from werk_host.experts.policy import (
    AccessEvent,
    Claim,
    ExpertObservation,
    ExpertPolicy,
    ExpertRecord,
    PolicySettings,
    ReliefPlan,
)

__all__ = [
    "AccessEvent",
    "Claim",
    "ExpertObservation",
    "ExpertPolicy",
    "ExpertRecord",
    "PolicySettings",
    "ReliefPlan",
]
