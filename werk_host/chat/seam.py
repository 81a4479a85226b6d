"""The optional backend seam for a session slot and its native snapshots (docs/chat.md, "Native snapshots").

The contract type :class:`~werk_host.seam.SessionSlot` lives with the other seam types
in :mod:`werk_host.seam` (the plugin seam sits below ``werk chat`` in docs/architecture.md,
"Layers"); this module names it for the chat code that drives it.
"""

from __future__ import annotations

from werk_host.seam import SessionSlot

__all__ = ["SessionSlot"]
