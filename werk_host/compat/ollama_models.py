"""What ``/api/tags``, ``/api/ps`` and ``/api/show`` say about served models (docs/compat.md).

Names are what routing accepts: every instance id and every alias, the list ``/v1/models``
gives. Facts come from the model manifests: ``size`` is the bytes of the model's files and
``digest`` the manifest identity (a SHA-256); when an alias's replicas differ in a fact it is
null. What Werk does not know (family, parameter size, quantization, the VRAM share, the
modification time) is null, never guessed. ``capabilities`` come from evidence about the
serving instance (:class:`Evidence`, gathered by werk_host/http/ollama.py), never from a
name. Nothing here starts an instance.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TypeVar

from pydantic import JsonValue

from werk_host.deployments.instances import Instance
from werk_host.deployments.registry import DeploymentSet
from werk_host.seam import JsonObject

#: The per-request context of a served name (``None`` when unknown, e.g. a cold instance).
ContextOf = Callable[[str], int | None]

T = TypeVar("T")


def _same(values: Sequence[T | None]) -> T | None:
    return values[0] if values and all(v == values[0] for v in values) else None


#: Ollama's model ``details``: none of them is known to Werk.
_DETAILS = ("parent_model", "format", "family", "families", "parameter_size", "quantization_level")


def _facts(replicas: Sequence[Instance]) -> JsonObject:
    sizes = [sum(f.bytes for f in r.manifest.files) if r.manifest.files else None for r in replicas]
    return {
        "size": _same(sizes),
        "digest": _same([r.manifest.identity for r in replicas]),
        "details": dict.fromkeys(_DETAILS),
    }


def names(deployments: DeploymentSet | None) -> list[str]:
    """Every name a request may use: instance ids, then aliases."""
    if deployments is None:
        return []
    return [*deployments.instances, *deployments.aliases]


def tags(deployments: DeploymentSet | None) -> JsonObject:
    """``GET /api/tags``: every served name."""
    if deployments is None:
        return {"models": []}
    models: list[JsonValue] = [
        {"name": name, "model": name, "modified_at": None, **_facts(deployments.replicas(name))}
        for name in names(deployments)
    ]
    return {"models": models}


def _iso(seconds: float) -> str | None:
    """``seconds`` since the epoch as an ISO 8601 instant; ``None`` (reported as never) for an
    instant no timestamp can hold. Stored idle times are bounded (werk_host/deployments/
    durations.py), so this is a guard, not a rule."""
    try:
        return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    except (OverflowError, OSError, ValueError):
        return None


def running(deployments: DeploymentSet | None, context_of: ContextOf) -> JsonObject:
    """``GET /api/ps``: the instances that are loaded, loading or unloading now, with their
    ``status`` and since when (docs/deployments.md, "Inventory"). ``expires_at`` is when the
    idle instance stops (its keep-alive: the profile's, or what a request asked for; null: kept
    forever, or not ready)."""
    models: list[JsonValue] = []
    for instance in deployments.instances.values() if deployments is not None else ():
        view = instance.view()
        if view.status not in ("loading", "ready", "unloading"):
            continue
        ready = view.status == "ready"
        expires_ms = view.expires_unix_ms
        expires = _iso(expires_ms / 1000) if expires_ms is not None else None
        since = _iso(view.since_unix_ms / 1000) if view.since_unix_ms is not None else None
        models.append(
            {
                "name": instance.id,
                "model": instance.id,
                **_facts((instance,)),
                "expires_at": expires,
                "size_vram": None,
                "context_length": context_of(instance.id) if ready else None,
                "status": view.status,
                "status_since": since,
            }
        )
    return {"models": models}


@dataclass(frozen=True)
class Evidence:
    """What the serving instance has shown it does (``None``: not known now, e.g. cold)."""

    tools: bool | None = None
    thinking: bool | None = None
    vision: bool | None = None
    #: a running embedding instance (its adapter's embedding limits; docs/embeddings.md)
    embedding: bool | None = None

    def capabilities(self) -> list[JsonValue]:
        """Ollama's ``capabilities``: ``embedding`` alone for an embedding model, as Ollama's;
        else ``completion`` (every other served model chats), then each capability with
        evidence."""
        if self.embedding:
            return ["embedding"]
        found: list[JsonValue] = ["completion"]
        found += [name for name in ("tools", "thinking", "vision") if getattr(self, name) is True]
        return found


def show(replicas: Sequence[Instance], context_tokens: int | None, evidence: Evidence) -> JsonObject:
    """``POST /api/show`` for a name served by ``replicas``: the known facts, the served
    per-request context as the ``num_ctx`` parameter when it is known, and the capabilities
    ``evidence`` shows."""
    facts = _facts(replicas)
    return {
        "modified_at": None,
        "details": facts["details"],
        "model_info": {},
        "parameters": f"num_ctx {context_tokens}" if context_tokens is not None else "",
        "capabilities": evidence.capabilities(),
    }
