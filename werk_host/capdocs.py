"""Render the capability → hooks table of docs/plugin-kit.md from the code.

A plugin author reads one table to learn which operation hooks back each capability id: the
operations each id scopes (:data:`werk_host.protocol.CAPABILITY_OPERATIONS`), the hooks the
host calls to serve them (:data:`CAPABILITY_HOOKS`, named through :mod:`werk_host.hookspecs`
so that a renamed or removed hook fails at import) and who reports the id's status. Run
``python -m werk_host.capdocs docs/plugin-kit.md`` after changing any of them; a test fails
while the file is stale, and another checks the conformance suite's required hooks
(``werk_host.testing.conformance.HOOKS_BEHIND``) against :data:`CAPABILITY_HOOKS`.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from werk_host import hookspecs
from werk_host.hookdocs import END as END
from werk_host.hookdocs import replace_section
from werk_host.protocol import CAPABILITY_OPERATIONS, CapabilityId

BEGIN = "<!-- BEGIN GENERATED: python -m werk_host.capdocs docs/plugin-kit.md -->"


@dataclass(frozen=True)
class Backing:
    """How one capability id is served: ``needs`` are the operation hooks it cannot work
    without (a plugin missing one must report the id ``unsupported``), ``uses`` hooks the host
    also calls when they are implemented, and ``host`` says the host reports the status from
    its own evidence (a plugin does not report it)."""

    needs: tuple[str, ...] = ()
    uses: tuple[str, ...] = ()
    host: bool = False


def _names(*specs: object) -> tuple[str, ...]:
    return tuple(getattr(spec, "__name__", "") for spec in specs)


_h = hookspecs

#: Every capability id with the hooks behind it (docs/plugin-kit.md, "Capabilities").
CAPABILITY_HOOKS: Final[Mapping[CapabilityId, Backing]] = {
    CapabilityId.TOKEN_COUNT: Backing(_names(_h.werk_count_tokens)),
    CapabilityId.ADMISSION: Backing(_names(_h.werk_chat_limits), _names(_h.werk_count_tokens)),
    CapabilityId.CHAT_LIMITS: Backing(_names(_h.werk_chat_limits)),
    CapabilityId.REASONING: Backing(_names(_h.werk_reasoning_profile)),
    CapabilityId.OMLX_OPTIONS: Backing(_names(_h.werk_request_options), _names(_h.werk_chat_completion)),
    CapabilityId.TELEMETRY_HOST: Backing(host=True),
    CapabilityId.TELEMETRY_ACCELERATOR: Backing(host=True),
    CapabilityId.RESERVATIONS: Backing(_names(_h.werk_memory_requirement), host=True),
    # a text backend's residency serves chats, a media backend's images (docs/media.md)
    CapabilityId.MODEL_RESIDENCY: Backing(
        uses=_names(_h.werk_chat_completion, _h.werk_image_generation, _h.werk_speech_synthesis, _h.werk_workers)
    ),
    CapabilityId.PREFIX_CACHE: Backing(_names(_h.werk_chat_completion)),
    CapabilityId.PROMPT_CACHE: Backing(_names(_h.werk_prompt_cache), host=True),
    CapabilityId.PERSISTENCE: Backing(_names(_h.werk_snapshot, _h.werk_compat_key)),
    CapabilityId.RESTORE: Backing(_names(_h.werk_decode, _h.werk_compat_key)),
    CapabilityId.CROSS_RESTART: Backing(_names(_h.werk_decode, _h.werk_compat_key)),
    CapabilityId.TIER_DISK: Backing(_names(_h.werk_snapshot), _names(_h.werk_state_move)),
    CapabilityId.TIER_RAM: Backing(_names(_h.werk_state_move)),
    CapabilityId.TIER_VRAM: Backing(_names(_h.werk_state_move)),
    CapabilityId.PD_PREFILL: Backing(_names(_h.werk_prefill), _names(_h.werk_release_state)),
    CapabilityId.PD_DECODE: Backing(_names(_h.werk_decode)),
    CapabilityId.PD_HANDOFF: Backing(_names(_h.werk_prefill, _h.werk_decode), _names(_h.werk_release_state)),
    CapabilityId.EXPERTS: Backing(_names(_h.werk_list_experts, _h.werk_expert_action)),
    CapabilityId.PLACEMENT: Backing(_names(_h.werk_deployment_plan)),
    CapabilityId.IMAGE_TXT2IMG: Backing(_names(_h.werk_image_generation, _h.werk_image_limits)),
    CapabilityId.IMAGE_IMG2IMG: Backing(_names(_h.werk_image_generation, _h.werk_image_limits)),
    CapabilityId.SPEECH_SYNTHESIS: Backing(_names(_h.werk_speech_synthesis, _h.werk_speech_limits)),
    CapabilityId.SPEECH_INSTRUCTIONS: Backing(_names(_h.werk_speech_synthesis, _h.werk_speech_limits)),
    CapabilityId.SPEECH_STREAMING: Backing(_names(_h.werk_speech_synthesis, _h.werk_speech_limits)),
    CapabilityId.EMBEDDINGS: Backing(_names(_h.werk_embed, _h.werk_embedding_limits), _names(_h.werk_tokenize)),
    CapabilityId.RERANK: Backing(_names(_h.werk_rerank, _h.werk_embedding_limits), _names(_h.werk_tokenize)),
}


def _code(names: tuple[str, ...]) -> str:
    return ", ".join(f"`{n}`" for n in names) or "—"


def _reporter(cap_id: CapabilityId, backing: Backing) -> str:
    """Who reports the status: the plugin (its ``werk_capabilities``) or the host."""
    if backing.host:
        return "host"
    if cap_id is CapabilityId.PLACEMENT:
        return "plugin, else host (`supported` when `werk_deployment_plan` answers)"
    return "plugin"


def capability_table() -> str:
    """The generated section: one row per capability id, in :class:`CapabilityId` order."""
    rows = [
        "| capability id | operations | status from | needs | also uses |",
        "| --- | --- | --- | --- | --- |",
    ]
    for cap_id in CapabilityId:
        backing = CAPABILITY_HOOKS[cap_id]
        cells = (
            f"`{cap_id.value}`",
            _code(CAPABILITY_OPERATIONS[cap_id]),
            _reporter(cap_id, backing),
            _code(backing.needs),
            _code(backing.uses),
        )
        rows.append(f"| {' | '.join(cells)} |")
    return "\n".join(rows) + "\n"


def render(guide: str) -> str:
    """``guide`` with its generated section replaced by the current table."""
    return replace_section(guide, BEGIN, capability_table())


def main(argv: list[str]) -> int:
    path = Path(argv[0] if argv else "docs/plugin-kit.md")
    path.write_text(render(path.read_text(encoding="utf-8")), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
