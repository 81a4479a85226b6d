"""ComfyUI's side of the custom-node interface, as ComfyUI does it, for the tests (ComfyUI
itself is not on a package registry): :func:`load_custom_node` imports a node folder's
``__init__.py`` the way ComfyUI's ``nodes.load_custom_node`` does; :func:`validate` checks an
API-format prompt as ComfyUI's ``execution.validate_inputs`` does (required inputs, link
types against the source's ``RETURN_TYPES``, widget types, ranges and combo values, then
``VALIDATE_INPUTS`` with the widget values only — a linked input is absent there); and
:func:`execute` runs the nodes in dependency order, calling ``FUNCTION`` with the inputs.
``stand_in_comfy`` provides ``comfy.utils.ProgressBar`` and the interrupt check, recording
what a node reports. Stdlib only: the media tests run it inside the engine's interpreter."""

from __future__ import annotations

import importlib.util
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Prompt = dict[str, dict[str, Any]]


def load_custom_node(folder: Path) -> dict[str, type]:
    name = folder.name
    spec = importlib.util.spec_from_file_location(name, folder / "__init__.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    mappings = module.NODE_CLASS_MAPPINGS
    assert isinstance(mappings, dict) and isinstance(module.NODE_DISPLAY_NAME_MAPPINGS, dict)
    return mappings


def _is_link(value: Any) -> bool:
    return isinstance(value, list) and len(value) == 2 and isinstance(value[0], str) and isinstance(value[1], int)


def _widget_error(kind: Any, options: dict[str, Any], value: Any) -> str | None:
    if isinstance(kind, list):
        return None if value in kind else f"value not in list: {value!r}"
    if kind == "INT":
        if isinstance(value, bool) or not isinstance(value, int):
            return "not an INT"
    elif kind == "FLOAT":
        if isinstance(value, bool) or not isinstance(value, int | float):
            return "not a FLOAT"
    elif kind == "STRING":
        return None if isinstance(value, str) else "not a STRING"
    elif kind == "BOOLEAN":
        return None if isinstance(value, bool) else "not a BOOLEAN"
    else:
        return f"{kind} must come from a link"
    if "min" in options and value < options["min"]:
        return f"value_smaller_than_min: {value} < {options['min']}"
    if "max" in options and value > options["max"]:
        return f"value_bigger_than_max: {value} > {options['max']}"
    return None


def validate(prompt: Prompt, mappings: dict[str, type]) -> dict[str, list[dict[str, str]]]:
    """Node id -> its errors (``{"type", "message"}``); empty when the prompt is valid."""
    errors: dict[str, list[dict[str, str]]] = {}
    for node_id, node in prompt.items():
        cls = mappings[node["class_type"]]
        declared = cls.INPUT_TYPES()  # type: ignore[attr-defined]
        inputs = node["inputs"]
        found: list[dict[str, str]] = []
        literals: dict[str, Any] = {}
        for section in ("required", "optional"):
            for name, spec in declared.get(section, {}).items():
                kind, options = spec[0], (spec[1] if len(spec) > 1 else {})
                if name not in inputs:
                    if section == "required":
                        found.append({"type": "required_input_missing", "message": name})
                    continue
                value = inputs[name]
                if _is_link(value):
                    source = mappings[prompt[value[0]]["class_type"]]
                    produced = source.RETURN_TYPES[value[1]]  # type: ignore[attr-defined]
                    if produced != kind:
                        found.append({"type": "return_type_mismatch", "message": f"{name}: {produced} != {kind}"})
                    continue
                problem = _widget_error(kind, options, value)
                if problem:
                    found.append({"type": "value_not_valid", "message": f"{name}: {problem}"})
                literals[name] = value
        if not found and hasattr(cls, "VALIDATE_INPUTS"):
            verdict = cls.VALIDATE_INPUTS(**literals)
            if verdict is not True:
                found.append({"type": "custom_validation_failed", "message": str(verdict)})
        if found:
            errors[node_id] = found
    return errors


class ExecutionError(Exception):
    def __init__(self, node_id: str, class_type: str, error: BaseException) -> None:
        self.node_id, self.class_type, self.error = node_id, class_type, error
        super().__init__(f"{class_type} #{node_id}: {error}")


def execute(
    prompt: Prompt, mappings: dict[str, type], after: Callable[[str, tuple[Any, ...]], None] | None = None
) -> dict[str, tuple[Any, ...]]:
    """Every node's outputs, run in dependency order (``after`` sees each node's as it ends);
    a node's exception as :class:`ExecutionError`."""
    outputs: dict[str, tuple[Any, ...]] = {}

    def run(node_id: str) -> tuple[Any, ...]:
        if node_id not in outputs:
            node = prompt[node_id]
            cls = mappings[node["class_type"]]
            values = {k: (run(v[0])[v[1]] if _is_link(v) else v) for k, v in node["inputs"].items()}
            try:
                result = getattr(cls(), cls.FUNCTION)(**values)  # type: ignore[attr-defined]
            except Exception as err:
                raise ExecutionError(node_id, node["class_type"], err) from err
            assert isinstance(result, tuple) and len(result) == len(cls.RETURN_TYPES)  # type: ignore[attr-defined]
            outputs[node_id] = result
            if after is not None:
                after(node_id, result)
        return outputs[node_id]

    for node_id in prompt:
        run(node_id)
    return outputs


@dataclass
class StandIn:
    progress: list[tuple[int, int]] = field(default_factory=list)
    interrupt: bool = False


def stand_in_comfy() -> StandIn:
    """``comfy.utils.ProgressBar`` and ``comfy.model_management``'s interrupt check, recording."""
    record = StandIn()
    comfy = types.ModuleType("comfy")
    utils = types.ModuleType("comfy.utils")
    management = types.ModuleType("comfy.model_management")

    class ProgressBar:
        def __init__(self, total: int) -> None:
            self.total = total

        def update_absolute(self, value: int, total: int | None = None) -> None:
            record.progress.append((value, total or self.total))

    class InterruptProcessingException(Exception):
        pass

    def throw_exception_if_processing_interrupted() -> None:
        if record.interrupt:
            raise InterruptProcessingException()

    utils.ProgressBar = ProgressBar  # type: ignore[attr-defined]
    management.throw_exception_if_processing_interrupted = throw_exception_if_processing_interrupted  # type: ignore[attr-defined]
    comfy.utils, comfy.model_management = utils, management  # type: ignore[attr-defined]
    sys.modules.update({"comfy": comfy, "comfy.utils": utils, "comfy.model_management": management})
    return record
