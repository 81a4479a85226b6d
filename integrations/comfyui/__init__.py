"""ComfyUI loads ``custom_nodes/<folder>/__init__.py``: this folder cloned (or linked) there
exports the nodes of :mod:`werk_comfyui` (docs/comfyui.md, "Install")."""

from .werk_comfyui import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS

__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS"]
