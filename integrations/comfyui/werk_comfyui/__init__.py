"""ComfyUI custom nodes for Werk host (docs/comfyui.md): ComfyUI reads
:data:`NODE_CLASS_MAPPINGS` and :data:`NODE_DISPLAY_NAME_MAPPINGS` from here."""

from __future__ import annotations

from typing import Final

from .control import WerkExpertActionNode, WerkExpertsNode, WerkStateActionNode, WerkStatesNode
from .media import WerkImageNode, WerkSpeechNode
from .text import WerkChatNode, WerkConnectionNode, WerkDecodeNode, WerkPrefillNode

NODE_CLASS_MAPPINGS: Final[dict[str, type]] = {
    "WerkConnection": WerkConnectionNode,
    "WerkChat": WerkChatNode,
    "WerkPrefill": WerkPrefillNode,
    "WerkDecode": WerkDecodeNode,
    "WerkStates": WerkStatesNode,
    "WerkStateAction": WerkStateActionNode,
    "WerkExperts": WerkExpertsNode,
    "WerkExpertAction": WerkExpertActionNode,
    "WerkImage": WerkImageNode,
    "WerkSpeech": WerkSpeechNode,
}

NODE_DISPLAY_NAME_MAPPINGS: Final[dict[str, str]] = {
    "WerkConnection": "Werk Connection",
    "WerkChat": "Werk Chat",
    "WerkPrefill": "Werk Prefill",
    "WerkDecode": "Werk Decode",
    "WerkStates": "Werk States",
    "WerkStateAction": "Werk State Action",
    "WerkExperts": "Werk Experts (experimental)",
    "WerkExpertAction": "Werk Expert Action (experimental)",
    "WerkImage": "Werk Image",
    "WerkSpeech": "Werk Speech",
}

__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS"]
