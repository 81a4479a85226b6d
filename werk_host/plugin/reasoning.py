"""Reasoning-profile helpers: the host's tier budgets over a backend's verified budget control
(docs/plugin-hooks.md, ``werk_reasoning_profile``)."""

from __future__ import annotations

from werk_host.service.reasoning import budget_profile, invalid_tier, unsupported_profile

__all__ = ["budget_profile", "invalid_tier", "unsupported_profile"]
