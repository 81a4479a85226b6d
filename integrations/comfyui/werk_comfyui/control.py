"""State and expert nodes (docs/comfyui.md, "Nodes"). Each answers one ``STRING`` of the
protocol's JSON (state ids, tiers, sizes: nothing secret).

* **Werk States** — ``GET /werk/v1/states`` (one page, filtered by model and tier).
* **Werk State Action** — ``POST /werk/v1/states/{id}/actions``: pin, unpin, promote, demote,
  evict, with ``dry_run``.
* **Werk Experts** and **Werk Expert Action** — ``GET /werk/v1/experts`` and
  ``POST /werk/v1/experts/actions``. Expert controls are experimental (docs/protocol.md,
  "Experts"): both refuse, at validation and before any request, unless their
  ``allow_experimental`` input is on.
"""

from __future__ import annotations

from typing import Any, Final

from werk_host.protocol import (
    ExpertActionRequest,
    ExpertListQuery,
    StateActionRequest,
    StateListQuery,
)

from .base import MODEL_INPUT, WerkNode, choice, flag, integer, shown, text
from .connection import CONNECTION, Connection
from .errors import WerkNodeError, checked, served

TIERS: Final = ("any", "vram", "ram", "disk", "external")
TARGETS: Final = ("none", "vram", "ram", "disk")
STATE_ACTIONS: Final = ("pin", "unpin", "promote", "demote", "evict")
EXPERT_ACTIONS: Final = ("prefetch", "pin", "unpin", "evict")
OPT_IN: Final = "expert controls are experimental: turn on allow_experimental to accept that they may change or fail"


def _opted_in(inputs: dict[str, Any]) -> None:
    if not flag(inputs, "allow_experimental"):
        raise WerkNodeError("experimental_opt_in_required", OPT_IN, "turn on allow_experimental on this node")


def _tier(inputs: dict[str, Any], name: str, options: tuple[str, ...]) -> str | None:
    value = choice(inputs, name, options)
    return None if value in ("any", "none") else value


class WerkStatesNode(WerkNode):
    RETURN_TYPES = ("STRING",)
    RETURN_NAMES = ("states_json",)

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                "connection": (CONNECTION,),
                "tier": (list(TIERS), {"default": "any"}),
                "limit": ("INT", {"default": 50, "min": 1, "max": 100}),
            },
            "optional": {"model": MODEL_INPUT},
        }

    @classmethod
    def build(cls, **inputs: Any) -> StateListQuery:
        query = {
            "model_id": text(inputs, "model", required=False, limit=256),
            "tier": _tier(inputs, "tier", TIERS),
            "limit": integer(inputs, "limit", 1, 100),
        }
        return checked(lambda: StateListQuery.model_validate(query))

    def run(self, connection: Connection, **inputs: Any) -> tuple[str]:
        query = self.build(**inputs)
        with served(connection.base_url):
            page = connection.client.list_states(query)
        return (shown(page.model_dump(mode="json")),)


class WerkStateActionNode(WerkNode):
    RETURN_TYPES = ("STRING",)
    RETURN_NAMES = ("result_json",)
    PLACEHOLDERS = {"state_id": "st_0"}

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                "connection": (CONNECTION,),
                "state_id": ("STRING", {"default": ""}),
                "action": (list(STATE_ACTIONS), {"default": "pin"}),
                "target_tier": (list(TARGETS), {"default": "none"}),
                "dry_run": ("BOOLEAN", {"default": True}),
                "allow_experimental": ("BOOLEAN", {"default": False}),
            }
        }

    @classmethod
    def build(cls, **inputs: Any) -> tuple[str, StateActionRequest]:
        state_id = str(text(inputs, "state_id", limit=256))
        body = {
            "action": choice(inputs, "action", STATE_ACTIONS),
            "target_tier": _tier(inputs, "target_tier", TARGETS),
            "dry_run": flag(inputs, "dry_run"),
            "allow_experimental": flag(inputs, "allow_experimental"),
        }
        return state_id, checked(lambda: StateActionRequest.model_validate(body))

    def run(self, connection: Connection, **inputs: Any) -> tuple[str]:
        state_id, request = self.build(**inputs)
        with served(connection.base_url):
            result = connection.client.state_action(state_id, request)
        return (shown(result.model_dump(mode="json")),)


class WerkExpertsNode(WerkNode):
    RETURN_TYPES = ("STRING",)
    RETURN_NAMES = ("experts_json",)

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                "connection": (CONNECTION,),
                "model": ("STRING", {"default": ""}),
                "tier": (list(TIERS), {"default": "any"}),
                "limit": ("INT", {"default": 100, "min": 1, "max": 100}),
                "allow_experimental": ("BOOLEAN", {"default": False}),
            }
        }

    @classmethod
    def build(cls, **inputs: Any) -> ExpertListQuery:
        _opted_in(inputs)
        query = {
            "model_id": text(inputs, "model", limit=256),
            "tier": _tier(inputs, "tier", TIERS),
            "limit": integer(inputs, "limit", 1, 100),
            "allow_experimental": True,
        }
        return checked(lambda: ExpertListQuery.model_validate(query))

    def run(self, connection: Connection, **inputs: Any) -> tuple[str]:
        query = self.build(**inputs)
        with served(connection.base_url):
            page = connection.client.list_experts(query)
        return (shown(page.model_dump(mode="json")),)


class WerkExpertActionNode(WerkNode):
    RETURN_TYPES = ("STRING",)
    RETURN_NAMES = ("result_json",)

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                "connection": (CONNECTION,),
                "model": ("STRING", {"default": ""}),
                "expert_ids": ("STRING", {"default": "", "tooltip": "comma-separated expert ids"}),
                "action": (list(EXPERT_ACTIONS), {"default": "prefetch"}),
                "target_tier": (list(TARGETS), {"default": "ram"}),
                "dry_run": ("BOOLEAN", {"default": True}),
                "allow_experimental": ("BOOLEAN", {"default": False}),
            }
        }

    @classmethod
    def build(cls, **inputs: Any) -> ExpertActionRequest:
        _opted_in(inputs)
        ids = [part.strip() for part in str(text(inputs, "expert_ids", limit=64 << 10)).split(",") if part.strip()]
        body = {
            "model_id": text(inputs, "model", limit=256),
            "expert_ids": ids,
            "action": choice(inputs, "action", EXPERT_ACTIONS),
            "target_tier": _tier(inputs, "target_tier", TARGETS),
            "dry_run": flag(inputs, "dry_run"),
            "allow_experimental": True,
        }
        return checked(lambda: ExpertActionRequest.model_validate(body), {"model_id": "model"})

    def run(self, connection: Connection, **inputs: Any) -> tuple[str]:
        request = self.build(**inputs)
        with served(connection.base_url):
            result = connection.client.expert_action(request)
        return (shown(result.model_dump(mode="json")),)
