"""Durable runtime-state store: ``WERK_HOME/runtime-state/v1`` (see :mod:`.store` and :mod:`.layout`)."""

from .records import (
    InventoryEntry,
    PruneOutcome,
    PurgeOutcome,
    StateRecord,
)
from .store import StateStore, runtime_state_root

__all__ = [
    "InventoryEntry",
    "PruneOutcome",
    "PurgeOutcome",
    "StateRecord",
    "StateStore",
    "runtime_state_root",
]
