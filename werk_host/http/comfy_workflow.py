"""ComfyUI workflows ("API format") parsed into one image request, validated whole first
(werk_host/http/comfy.py states the contract of the routes).

The nodes served are :data:`NODES`, each described as ComfyUI's ``INPUT_TYPES`` would be (its
``nodes.py``), with Werk's own bounds as the ranges (werk_host/protocol/media.py): a client
reading ``/object_info`` sees what this host accepts. :func:`parse` follows ComfyUI's
``execution.validate_prompt``: every node's ``class_type`` must be known (else
``invalid_prompt``, naming the node and class), there must be an output node
(``prompt_no_outputs``), and every node an output depends on is checked input by input
(``required_input_missing``, ``bad_linked_input``, ``return_type_mismatch``,
``invalid_input_type``, ``value_smaller_than_min``, ``value_bigger_than_max``,
``value_not_in_list``, ``custom_validation_failed`` for Werk's own rules, and
``dependency_cycle``), answered as ``prompt_outputs_failed_validation`` with ``node_errors``.
Then the graph's shape: one chain ``CheckpointLoaderSimple`` → ``CLIPTextEncode`` ×2 →
``EmptyLatentImage`` → ``KSampler`` → ``VAEDecode`` → ``SaveImage``/``PreviewImage`` (several
output nodes may share it); the sampler must be one the checkpoint's backend runs; and last the
:class:`~werk_host.protocol.media.ImageRequest` bounds, each failure a node error on the input
at fault.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from pydantic import ValidationError

from werk_host.protocol.media import (
    IMAGE_SIDE_MULTIPLE,
    MAX_IMAGE_BATCH,
    MAX_IMAGE_SIDE,
    MAX_IMAGE_STEPS,
    MAX_PROMPT_CHARS,
    MAX_SEED,
    ImageRequest,
)

__all__ = ["COMFY_SAMPLERS", "NODES", "Choices", "Output", "Workflow", "WorkflowError", "parse", "prompt_error"]

#: ComfyUI's sampler names and the A1111-style names Werk's backends use (``pndm``/``plms`` are
#: no ComfyUI names: they reach the Diffusers backend's ``PNDM``/``PLMS``).
COMFY_SAMPLERS: Final = {
    "euler": "Euler",
    "euler_ancestral": "Euler a",
    "heun": "Heun",
    "dpm_2": "DPM2",
    "dpm_2_ancestral": "DPM2 a",
    "lms": "LMS",
    "dpm_fast": "DPM fast",
    "dpm_adaptive": "DPM adaptive",
    "dpmpp_2s_ancestral": "DPM++ 2S a",
    "dpmpp_sde": "DPM++ SDE",
    "dpmpp_2m": "DPM++ 2M",
    "dpmpp_2m_sde": "DPM++ 2M SDE",
    "dpmpp_3m_sde": "DPM++ 3M SDE",
    "ddim": "DDIM",
    "uni_pc": "UniPC",
    "lcm": "LCM",
    "pndm": "PNDM",
    "plms": "PLMS",
}
#: ``normal``: the backend's own schedule for the sampler; ``karras``: its ``<name> Karras``
#: sampler, only where the backend has one.
SCHEDULERS: Final = ("normal", "karras")
MAX_NODES: Final = 256
MAX_PREFIX_CHARS: Final = 1024
OUTPUT_TYPES: Final = {"SaveImage": "output", "PreviewImage": "temp"}


@dataclass(frozen=True)
class Input:
    """One required input: ``kind`` a link type (``MODEL``, ...), ``INT``, ``FLOAT``,
    ``STRING`` or ``CHOICE`` (its list from :class:`Choices`, named by ``choices``)."""

    kind: str
    options: dict[str, Any] = field(default_factory=dict)
    choices: str = ""
    exact: float | None = None  # the one value accepted (KSampler's denoise)

    @property
    def link(self) -> bool:
        return self.kind not in ("INT", "FLOAT", "STRING", "CHOICE")


@dataclass(frozen=True)
class Node:
    name: str
    display_name: str
    category: str
    inputs: dict[str, Input]
    outputs: tuple[str, ...] = ()
    output_node: bool = False
    description: str = ""


def _side() -> Input:
    return Input(
        "INT", {"default": 512, "min": IMAGE_SIDE_MULTIPLE, "max": MAX_IMAGE_SIDE, "step": IMAGE_SIDE_MULTIPLE}
    )


NODES: Final[dict[str, Node]] = {
    n.name: n
    for n in (
        Node(
            "CheckpointLoaderSimple",
            "Load Checkpoint",
            "loaders",
            {"ckpt_name": Input("CHOICE", choices="ckpt_name")},
            ("MODEL", "CLIP", "VAE"),
            description="A served media model (its instance id): model, text encoder and VAE come together.",
        ),
        Node(
            "CLIPTextEncode",
            "CLIP Text Encode (Prompt)",
            "conditioning",
            {"text": Input("STRING", {"multiline": True, "dynamicPrompts": True}), "clip": Input("CLIP")},
            ("CONDITIONING",),
        ),
        Node(
            "EmptyLatentImage",
            "Empty Latent Image",
            "latent",
            {
                "width": _side(),
                "height": _side(),
                "batch_size": Input("INT", {"default": 1, "min": 1, "max": MAX_IMAGE_BATCH}),
            },
            ("LATENT",),
        ),
        Node(
            "KSampler",
            "KSampler",
            "sampling",
            {
                "model": Input("MODEL"),
                "seed": Input("INT", {"default": 0, "min": 0, "max": MAX_SEED, "control_after_generate": True}),
                "steps": Input("INT", {"default": 20, "min": 1, "max": MAX_IMAGE_STEPS}),
                "cfg": Input("FLOAT", {"default": 8.0, "min": 0.0, "max": 50.0, "step": 0.1, "round": 0.01}),
                "sampler_name": Input("CHOICE", choices="sampler_name"),
                "scheduler": Input("CHOICE", choices="scheduler"),
                "positive": Input("CONDITIONING"),
                "negative": Input("CONDITIONING"),
                "latent_image": Input("LATENT"),
                "denoise": Input("FLOAT", {"default": 1.0, "min": 1.0, "max": 1.0, "step": 0.01}, exact=1.0),
            },
            ("LATENT",),
            description="Text to image only: denoise is 1.0 and the latent an EmptyLatentImage.",
        ),
        Node("VAEDecode", "VAE Decode", "latent", {"samples": Input("LATENT"), "vae": Input("VAE")}, ("IMAGE",)),
        Node(
            "SaveImage",
            "Save Image",
            "image",
            {"images": Input("IMAGE"), "filename_prefix": Input("STRING", {"default": "ComfyUI"})},
            output_node=True,
            description="The images stay in the host's job store; /view serves them (no workflow embedded).",
        ),
        Node("PreviewImage", "Preview Image", "image", {"images": Input("IMAGE")}, output_node=True),
    )
}
_IMG2IMG_NODES: Final = frozenset({"LoadImage", "VAEEncode", "LoadImageMask", "VAEEncodeForInpaint"})


@dataclass(frozen=True)
class Choices:
    """The lists that depend on what is served: the checkpoints (media instance ids) and, for
    one of them, the backend's sampler names (A1111's)."""

    checkpoints: list[str]
    samplers: Callable[[str], list[str]]


def comfy_samplers(backend: list[str]) -> list[str]:
    """The ComfyUI sampler names that reach one of ``backend``'s samplers."""
    return [name for name, mapped in COMFY_SAMPLERS.items() if mapped in backend]


def comfy_schedulers(backend: list[str]) -> list[str]:
    karras = any(f"{mapped} Karras" in backend for mapped in COMFY_SAMPLERS.values())
    return ["normal", "karras"] if karras else ["normal"]


@dataclass(frozen=True)
class Output:
    node_id: str
    type: str  # "output" (SaveImage) or "temp" (PreviewImage)
    prefix: str  # the filename prefix, made safe


@dataclass(frozen=True)
class Workflow:
    """A valid prompt: the model, the image request's fields, its outputs, the nodes that run
    (as ``prompt``: only their known inputs) and the sampler's node."""

    model: str
    fields: dict[str, Any]
    outputs: list[Output]
    prompt: dict[str, Any]
    sampler_node: str


class WorkflowError(Exception):
    """A refused prompt: ``body`` is ComfyUI's 400 answer."""

    def __init__(self, body: dict[str, Any]) -> None:
        super().__init__(body["error"]["message"])
        self.body = body


def prompt_error(kind: str, message: str, details: str = "") -> WorkflowError:
    error = {"type": kind, "message": message, "details": details, "extra_info": {}}
    return WorkflowError({"error": error, "node_errors": {}})


def _short(value: object) -> object:
    """A received value as an error may echo it: long strings and containers cut short."""
    if isinstance(value, str):
        return value if len(value) <= 64 else value[:64] + "..."
    if isinstance(value, list | dict):
        return _short(repr(value))
    return value


def _reason(kind: str, message: str, details: str, name: str, **extra: Any) -> dict[str, Any]:
    info = {"input_name": name, **{k: _short(v) for k, v in extra.items()}}
    return {"type": kind, "message": message, "details": details, "extra_info": info}


def _custom(name: str, why: str, value: object = None) -> dict[str, Any]:
    return _reason(
        "custom_validation_failed", "Custom validation failed for node", f"{name} - {why}", name, received_value=value
    )


def safe_prefix(prefix: str) -> str:
    """A filename prefix as it appears in a file name: ``[A-Za-z0-9_-]``, at most 64."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", prefix)[:64] or "ComfyUI"


class _Parser:
    def __init__(self, prompt: dict[str, Any], choices: Choices) -> None:
        self.prompt = prompt
        self.choices = choices
        self.errors: dict[str, list[dict[str, Any]]] = {}
        self.done: dict[str, bool] = {}
        self.values: dict[str, dict[str, Any]] = {}  # node id -> its checked inputs

    def cls(self, node_id: str) -> Node:
        return NODES[self.prompt[node_id]["class_type"]]

    def fail(self, node_id: str, reason: dict[str, Any]) -> None:
        self.errors.setdefault(node_id, []).append(reason)

    def choice_list(self, input_: Input) -> list[str]:
        if input_.choices == "ckpt_name":
            return self.choices.checkpoints
        if input_.choices == "sampler_name":
            return list(COMFY_SAMPLERS)
        return list(SCHEDULERS)

    def validate(self, node_id: str, stack: set[str]) -> bool:
        if node_id in self.done:
            return self.done[node_id]
        stack.add(node_id)
        spec = self.cls(node_id)
        inputs = self.prompt[node_id].get("inputs", {})
        values: dict[str, Any] = {}
        valid = True
        for name, input_ in spec.inputs.items():
            if name not in inputs:
                self.fail(node_id, _reason("required_input_missing", "Required input is missing", name, name))
                continue
            value = inputs[name]
            if input_.link:
                source = self.link(node_id, name, input_, value, stack)
                if source is None:
                    continue
                values[name] = source
                valid = self.validate(source[0], stack) and valid
            else:
                checked = self.scalar(node_id, name, input_, value)
                if checked is not None:
                    values[name] = checked
        stack.discard(node_id)
        self.values[node_id] = values
        self.done[node_id] = ok = valid and node_id not in self.errors
        return ok

    def link(self, node_id: str, name: str, input_: Input, value: object, stack: set[str]) -> tuple[str, int] | None:
        shape = (
            isinstance(value, list)
            and len(value) == 2
            and isinstance(value[0], str)
            and type(value[1]) is int
            and value[1] >= 0
        )
        if not shape:
            message = "Bad linked input, must be a length-2 list of [node_id, slot_index]"
            self.fail(node_id, _reason("bad_linked_input", message, name, name, received_value=value))
            return None
        assert isinstance(value, list)
        source, slot = str(value[0]), int(value[1])
        if source not in self.prompt:
            details = f"{name}: node '{_short(source)}' is not in the prompt"
            self.fail(
                node_id, _reason("bad_linked_input", "Linked node does not exist", details, name, linked_node=value)
            )
            return None
        outputs = self.cls(source).outputs
        received = outputs[slot] if slot < len(outputs) else None
        if received != input_.kind:
            details = f"{name}, {received or 'no output ' + str(slot)} != {input_.kind}"
            self.fail(
                node_id,
                _reason(
                    "return_type_mismatch",
                    "Return type mismatch between linked nodes",
                    details,
                    name,
                    received_type=received,
                    linked_node=value,
                ),
            )
            return None
        if source in stack:
            details = f"{name}: node '{_short(source)}' depends on this node"
            self.fail(
                node_id, _reason("dependency_cycle", "Dependency cycle detected", details, name, linked_node=value)
            )
            return None
        return source, slot

    def scalar(self, node_id: str, name: str, input_: Input, value: object) -> object:
        kind = input_.kind
        converted: object = None
        if kind == "INT" and type(value) is int:
            converted = value
        elif kind == "INT" and type(value) is float and value.is_integer():
            converted = int(value)
        elif kind == "FLOAT" and isinstance(value, int | float) and type(value) is not bool and math.isfinite(value):
            converted = float(value)
        elif kind in ("STRING", "CHOICE") and isinstance(value, str):
            converted = value
        if converted is None:
            wanted = "STRING" if kind == "CHOICE" else kind
            message = f"Failed to convert an input value to a {wanted} value"
            details = f"{name}, {_short(value)}"
            self.fail(node_id, _reason("invalid_input_type", message, details, name, received_value=value))
            return None
        options = input_.options
        if input_.exact is not None:
            if converted != input_.exact:
                why = f"must be {input_.exact}: image-to-image is not served through the Comfy routes"
                self.fail(node_id, _custom(name, why, converted))
                return None
        elif isinstance(converted, int | float):
            if "min" in options and converted < options["min"]:
                message = f"Value {converted} smaller than min of {options['min']}"
                self.fail(node_id, _reason("value_smaller_than_min", message, name, name, received_value=converted))
                return None
            if "max" in options and converted > options["max"]:
                message = f"Value {converted} bigger than max of {options['max']}"
                self.fail(node_id, _reason("value_bigger_than_max", message, name, name, received_value=converted))
                return None
            step = options.get("step")
            if kind == "INT" and isinstance(step, int) and converted % step:
                self.fail(node_id, _custom(name, f"must be a multiple of {step}", converted))
                return None
        elif kind == "CHOICE":
            allowed = self.choice_list(input_)
            if converted not in allowed:
                shown = allowed if len(allowed) <= 20 else f"(list of length {len(allowed)})"
                self.fail(
                    node_id,
                    _reason(
                        "value_not_in_list",
                        "Value not in list",
                        f"{name}: '{_short(converted)}' not in {shown}",
                        name,
                        received_value=converted,
                    ),
                )
                return None
        elif isinstance(converted, str):
            limit = MAX_PREFIX_CHARS if name == "filename_prefix" else MAX_PROMPT_CHARS
            if len(converted) > limit:
                self.fail(node_id, _custom(name, f"must be at most {limit} characters"))
                return None
        return converted


def parse(prompt: object, choices: Choices) -> Workflow:
    """``prompt`` (``POST /prompt``'s ``prompt``) as one image request (module docstring);
    :class:`WorkflowError` with ComfyUI's answer when it is refused."""
    if not isinstance(prompt, dict):
        raise prompt_error("invalid_prompt", "The prompt must be a JSON object of nodes")
    if len(prompt) > MAX_NODES:
        raise prompt_error("invalid_prompt", f"A prompt has at most {MAX_NODES} nodes on this host")
    outputs: list[str] = []
    for node_id, node in prompt.items():
        where = f"Node ID '#{_short(node_id)}'"
        if not isinstance(node, dict) or not isinstance(node.get("inputs", {}), dict):
            raise prompt_error("invalid_prompt", "Cannot execute because a node is not an object with inputs.", where)
        class_type = node.get("class_type")
        if not isinstance(class_type, str):
            raise prompt_error(
                "invalid_prompt", "Cannot execute because a node is missing the class_type property.", where
            )
        if class_type not in NODES:
            served = ", ".join(NODES)
            extra = (
                "image-to-image through the Comfy routes is not served (use /sdapi/v1/img2img or a "
                "/werk/v1/jobs image job with init_image); "
                if class_type in _IMG2IMG_NODES
                else ""
            )
            message = f"Cannot execute because node {_short(class_type)} does not exist."
            raise prompt_error("invalid_prompt", message, f"{where}: {extra}this host serves {served}")
        if NODES[class_type].output_node:
            outputs.append(node_id)
    if not outputs:
        raise prompt_error("prompt_no_outputs", "Prompt has no outputs")
    parser = _Parser(prompt, choices)
    for output in outputs:
        parser.validate(output, set())
    if not parser.errors:
        _shape(parser, outputs)
    if not parser.errors:
        workflow = _workflow(parser, outputs)
        _bounds(parser, workflow)
        if not parser.errors:
            return workflow
    raise _failed(parser, outputs)


def _failed(parser: _Parser, outputs: list[str]) -> WorkflowError:
    node_errors: dict[str, Any] = {}
    for node_id, reasons in parser.errors.items():
        dependent = [o for o in outputs if node_id in _reachable(parser.prompt, o)]
        node_errors[node_id] = {
            "errors": reasons,
            "dependent_outputs": dependent,
            "class_type": parser.prompt[node_id]["class_type"],
        }
    details = "\n".join(f"{r['message']}: {r['details']}" for rs in parser.errors.values() for r in rs)
    error = {
        "type": "prompt_outputs_failed_validation",
        "message": "Prompt outputs failed validation",
        "details": details,
        "extra_info": {},
    }
    return WorkflowError({"error": error, "node_errors": node_errors})


def _reachable(prompt: Mapping[str, Any], start: str) -> set[str]:
    seen: set[str] = set()
    todo = [start]
    while todo:
        node_id = todo.pop()
        if node_id in seen or node_id not in prompt:
            continue
        seen.add(node_id)
        for value in prompt[node_id].get("inputs", {}).values():
            if isinstance(value, list) and len(value) == 2 and isinstance(value[0], str):
                todo.append(value[0])
    return seen


def _source(parser: _Parser, node_id: str, name: str) -> str:
    source: tuple[str, int] = parser.values[node_id][name]
    return source[0]


def _shape(parser: _Parser, outputs: list[str]) -> None:
    """The one chain this host runs (module docstring)."""
    sampler: str | None = None
    for output in outputs:
        decode = _source(parser, output, "images")  # only VAEDecode makes an IMAGE
        ks = _source(parser, decode, "samples")
        if parser.cls(ks).name != "KSampler":
            parser.fail(decode, _custom("samples", "must come from a KSampler: only sampled latents are decoded"))
            continue
        if sampler is not None and ks != sampler:
            why = "every output must come from the same KSampler: this host runs one generation per prompt"
            parser.fail(output, _custom("images", why))
            continue
        sampler = ks
    if sampler is None or parser.errors:
        return
    latent = _source(parser, sampler, "latent_image")
    if parser.cls(latent).name != "EmptyLatentImage":
        why = "must come from an EmptyLatentImage: image-to-image and refining are not served through Comfy"
        parser.fail(sampler, _custom("latent_image", why))
    ckpt = parser.values[_source(parser, sampler, "model")]["ckpt_name"]
    users = [(_source(parser, sampler, "positive"), "clip"), (_source(parser, sampler, "negative"), "clip")]
    users += [(_source(parser, output, "images"), "vae") for output in outputs]
    for node_id, name in users:
        if parser.values[_source(parser, node_id, name)]["ckpt_name"] != ckpt:
            parser.fail(node_id, _custom(name, "must come from the same checkpoint as the KSampler's model"))
    chosen = parser.values[sampler]
    backend = parser.choices.samplers(ckpt)
    mapped = COMFY_SAMPLERS[chosen["sampler_name"]]
    if mapped not in backend:
        allowed = comfy_samplers(backend)
        parser.fail(
            sampler,
            _reason(
                "value_not_in_list",
                "Value not in list",
                f"sampler_name: '{chosen['sampler_name']}' not in {allowed}",
                "sampler_name",
                received_value=chosen["sampler_name"],
            ),
        )
    elif chosen["scheduler"] == "karras" and f"{mapped} Karras" not in backend:
        why = f"model {ckpt} has no Karras schedule for {chosen['sampler_name']}: use scheduler normal"
        parser.fail(sampler, _custom("scheduler", why, "karras"))


def _sources(parser: _Parser, sampler: str) -> dict[str, tuple[str, str]]:
    """Each image request field's node and input in the graph of the ``KSampler`` ``sampler``."""
    latent = _source(parser, sampler, "latent_image")
    return {
        "prompt": (_source(parser, sampler, "positive"), "text"),
        "negative_prompt": (_source(parser, sampler, "negative"), "text"),
        "width": (latent, "width"),
        "height": (latent, "height"),
        "n": (latent, "batch_size"),
        "steps": (sampler, "steps"),
        "guidance_scale": (sampler, "cfg"),
        "seed": (sampler, "seed"),
        "sampler": (sampler, "sampler_name"),
    }


def _workflow(parser: _Parser, outputs: list[str]) -> Workflow:
    decode = _source(parser, outputs[0], "images")
    sampler = _source(parser, decode, "samples")
    ks = parser.values[sampler]
    fields = {name: parser.values[node_id][input_] for name, (node_id, input_) in _sources(parser, sampler).items()}
    mapped = COMFY_SAMPLERS[ks["sampler_name"]]
    fields["sampler"] = f"{mapped} Karras" if ks["scheduler"] == "karras" else mapped
    found: list[Output] = []
    for output in outputs:
        kind = OUTPUT_TYPES[parser.cls(output).name]
        prefix = parser.values[output].get("filename_prefix", "ComfyUI_temp" if kind == "temp" else "ComfyUI")
        found.append(Output(output, kind, safe_prefix(prefix)))
    ran: dict[str, Any] = {}
    reached: set[str] = set()
    for output in outputs:
        reached |= _reachable(parser.prompt, output)
    for node_id in sorted(reached):
        node = parser.prompt[node_id]
        spec = NODES[node["class_type"]]
        known = {k: v for k, v in node.get("inputs", {}).items() if k in spec.inputs}
        ran[node_id] = {"inputs": known, "class_type": spec.name}
    model = parser.values[_source(parser, sampler, "model")]["ckpt_name"]
    return Workflow(model, fields, found, ran, sampler)


def _bounds(parser: _Parser, workflow: Workflow) -> None:
    """The image request's own bounds, each failure on the input that carries the field."""
    sampler = workflow.sampler_node
    where = _sources(parser, sampler)
    fields = workflow.fields
    if fields["seed"] + fields["n"] - 1 > MAX_SEED:
        parser.fail(sampler, _custom("seed", f"seed + batch_size - 1 must be at most {MAX_SEED}", fields["seed"]))
        return
    try:
        ImageRequest.model_validate({**fields, "model": workflow.model})
    except ValidationError as err:
        for item in err.errors(include_input=False, include_url=False):
            loc = item.get("loc", ())
            node_id, name = where.get(str(loc[0]) if loc else "", where["width"])
            parser.fail(node_id, _custom(name, str(item.get("msg", "invalid"))))
