"""``GET /werk/v1/deployments``: the instances a host serves, their resolved plans and slots
(docs/deployments.md, "Inventory")."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import Field

from werk_host.protocol.base import DataModel, StrictModel


class InstanceStateName(StrEnum):
    COLD = "cold"
    STARTING = "starting"
    READY = "ready"
    STOPPING = "stopping"
    FAILED = "failed"


class EndpointKind(StrEnum):
    LOCAL = "local"
    REMOTE = "remote"


class FileCacheFile(DataModel):
    """One model file at the last release: its name (never its directory) and why it was kept."""

    file: str
    bytes: int
    released: bool
    why: str | None = None


class InstanceFileCache(DataModel):
    """The model-lifetime guard of a local instance (docs/operations.md, "Model file cache")."""

    #: the switch as configured, and whether it releases here (``auto``: under WSL only)
    mode: Literal["auto", "on", "off"]
    release: bool
    #: the model files holding a shared lease now (0 while cold)
    leased_files: int
    #: the outcome of the last unload's release (null before the first)
    last_release: list[FileCacheFile] | None = None


class InstanceInventory(DataModel):
    id: str
    backend: str
    model: str
    aliases: list[str]
    default: bool
    state: InstanceStateName
    #: the backend's main process while it runs locally (null when cold, remote or unknown)
    pid: int | None
    endpoint: EndpointKind
    started_unix_ms: int | None
    last_used_unix_ms: int | None
    in_flight: int
    keep_alive_seconds: float | None
    #: why the last start failed (redacted; null unless ``state`` is ``failed``)
    error: str | None
    #: when ``state`` last changed
    state_since_unix_ms: int | None = None
    #: how long the last successful start (load) took
    load_seconds: float | None = None
    #: never unloaded to make room (the profile's ``pin`` or an operator's pin)
    pinned: bool = False
    #: the residency group the instance belongs to (docs/deployments.md, "Residency limits")
    group: str | None = None
    #: the memory the instance needs loaded: declared, or estimated (docs/deployments.md)
    memory_estimate_bytes: int | None = None
    #: the model files' page-cache guard (null for a remote instance)
    file_cache: InstanceFileCache | None = None


class DeploymentPlan(DataModel):
    """A backend's resolved placement (``werk_deployment_plan``): what it actually runs with."""

    endpoint: EndpointKind
    #: effective launch arguments; secrets and filesystem paths replaced by placeholders
    arguments: list[str]
    threads: int | None
    parallel_slots: int | None
    context_per_slot: int | None
    #: where the weights run, e.g. ``cpu`` or ``gpu (33 layers offloaded)``
    device: str | None


class InstancePlan(DataModel):
    instance: str
    #: null while the instance is not ready or its backend reports no plan
    plan: DeploymentPlan | None


class InstanceSlots(DataModel):
    instance: str
    total: int | None
    #: requests Werk has in flight on the instance
    busy: int
    free: int | None


class Deployments(DataModel):
    inventory: list[InstanceInventory]
    plans: list[InstancePlan]
    slots: list[InstanceSlots]


#: What ``POST /werk/v1/deployments/{id}/actions`` may do (docs/deployments.md, "Operator actions").
DeploymentActionName = Literal["load", "unload", "pin", "unpin"]


class DeploymentActionRequest(StrictModel):
    action: DeploymentActionName


class DeploymentActionResult(DataModel):
    action: DeploymentActionName
    #: the instance after the action
    instance: InstanceInventory


class DeploymentLogsQuery(StrictModel):
    lines: int = Field(100, ge=1, le=200)


class DeploymentLogs(DataModel):
    """An instance's log tails, oldest first, never a path, key or process id: ``lines`` are
    Werk's lifecycle events (ids, states, public reasons); ``backend_lines`` the backend's own
    log while the instance is loaded, redacted (docs/deployments.md, "Operator actions")."""

    instance: str
    #: Werk's lifecycle events of the instance
    lines: list[str]
    #: the last lines of the backend's own log (``werk_log_tail``), redacted; ``None`` while the
    #: instance is not loaded or when its backend keeps no log
    backend_lines: list[str] | None = None
