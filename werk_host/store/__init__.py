"""Durable runtime-state store: ``WERK_HOME/runtime-state/v1`` (see :mod:`.store`)."""

from .records import (
    InventoryEntry,
    PruneOutcome,
    PurgeOutcome,
    ReconcileReport,
    StateRecord,
)
from .store import StateStore, runtime_state_root

__all__ = [
    "InventoryEntry",
    "PruneOutcome",
    "PurgeOutcome",
    "ReconcileReport",
    "StateRecord",
    "StateStore",
    "runtime_state_root",
]
