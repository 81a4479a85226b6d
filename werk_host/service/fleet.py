"""The deployment set of a host and where each request's scope comes from.

The HTTP layer resolves every request's instance once (``X-Werk-Deployment`` on control
routes, ``model`` on ``/v1`` and chat planning; docs/deployments.md, "Routing") into a
:class:`~werk_host.service.scope.RequestScope` (:meth:`Fleet.scope`) that is passed
explicitly to the service; nothing here depends on which request is running. :attr:`adapter`
and :attr:`model` are the *default* instance's (a single-model host's one instance).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from werk_host.config import HostConfig
from werk_host.deployments.instances import Instance
from werk_host.deployments.profile import DeploymentProfile
from werk_host.deployments.registry import DeploymentSet
from werk_host.deployments.report import deployment_report
from werk_host.errors import ErrorCode, WerkError
from werk_host.hooks import BackendHooks
from werk_host.memory import MemoryManager
from werk_host.models import ModelManifest
from werk_host.pluginhost import PluginHost
from werk_host.protocol.deployments import (
    DeploymentActionRequest,
    DeploymentActionResult,
    DeploymentLogs,
    InstanceInventory,
)
from werk_host.seam import Adapter
from werk_host.service.principals import Principal
from werk_host.service.scope import RequestScope

log = logging.getLogger(__name__)


class Fleet:
    """The plugin host, its typed hook facade, and the deployment set (or none)."""

    def __init__(self, plugins: PluginHost, config: HostConfig) -> None:
        self.plugins = plugins
        self.hooks = BackendHooks(plugins)
        self.config = config
        self.deployments: DeploymentSet | None = None
        #: live handoffs bound to an adapter identity (set by the control service that issues
        #: them); residency never unloads an instance that has any (docs/deployments.md)
        self.live_handoffs: Callable[[str], int] = lambda _identity: 0
        #: drops the live handoffs bound to an adapter identity (set with ``live_handoffs``):
        #: past ``handoff_wait`` residency unloads an instance anyway and they expire
        self.expire_handoffs: Callable[[str], int] = lambda _identity: 0
        #: told when an instance became ready (set by the control service: its prompt caches
        #: warm the new process's slot, docs/prompt-cache.md)
        self.on_ready: Callable[[str, Adapter], None] = lambda _label, _adapter: None
        #: the host's memory telemetry (set by the control service that reports it): residency
        #: admits starts against it (docs/deployments.md, "Memory estimate")
        self.memory: MemoryManager | None = None

    def _has_live_handoffs(self, instance: Instance) -> bool:
        adapter = instance.peek()
        return adapter is not None and self.live_handoffs(adapter.identity()) > 0

    def deploy(self, profile: DeploymentProfile) -> DeploymentSet:
        """Build the instances of ``profile`` (every backend resolved, or ``ProfileError``) and
        preload the ``preload`` ones; a preload failure stays on its instance."""
        deployments = DeploymentSet(
            profile,
            self.plugins,
            self.config,
            live_handoffs=self._has_live_handoffs,
            expire_handoffs=lambda identity: self.expire_handoffs(identity),
            on_ready=lambda instance, adapter: self.on_ready(instance.id, adapter),
            memory=self.memory,
        )
        self.deployments = deployments
        deployments.start()
        return deployments

    # -- operator actions (docs/deployments.md, "Operator actions") -------------------------
    def _operated(self, principal: Principal, instance_id: str, what: str) -> DeploymentSet:
        """The deployment set, for an operator (403 ``forbidden`` for any other key; residency
        and backend logs are the operator's, docs/deployments.md, "Residency")."""
        if not principal.operator:
            raise WerkError(ErrorCode.FORBIDDEN, f"{what} needs an operator key")
        if self.deployments is None or instance_id not in self.deployments.instances:
            raise WerkError(ErrorCode.NOT_FOUND, "no deployment instance has that id")
        return self.deployments

    def act(self, principal: Principal, instance_id: str, request: DeploymentActionRequest) -> DeploymentActionResult:
        """Load, unload, pin or unpin an instance (:meth:`DeploymentSet.act`)."""
        deployments = self._operated(principal, instance_id, "changing an instance's residency")
        deployments.act(instance_id, request.action)
        return DeploymentActionResult(action=request.action, instance=self._inventory(deployments, instance_id))

    def logs(self, principal: Principal, instance_id: str, lines: int) -> DeploymentLogs:
        """The instance's lifecycle log tail and, while it is loaded, its backend's own
        (``werk_log_tail``, redacted again by the facade, the host's API keys too); public text
        only."""
        deployments = self._operated(principal, instance_id, "reading an instance's log")
        instance = deployments.instances[instance_id]
        adapter = instance.peek()
        try:
            keys = (*self.config.api_keys, *self.config.operator_api_keys)
            backend = self.hooks.log_tail(adapter, lines, keys) if adapter is not None else None
        except WerkError as err:  # a backend that cannot read its log still leaves Werk's events
            log.warning("instance %s: the backend's log tail failed: %s", instance_id, err.message)
            backend = None
        return DeploymentLogs(instance=instance_id, lines=instance.events(lines), backend_lines=backend)

    def _inventory(self, deployments: DeploymentSet, instance_id: str) -> InstanceInventory:
        report = deployment_report(deployments, self.hooks)
        return next(entry for entry in report.inventory if entry.id == instance_id)

    # -- the default instance and request scopes ------------------------------------------
    @property
    def default(self) -> Instance | None:
        """The default instance; ``None`` when nothing is deployed."""
        return self.deployments.default if self.deployments is not None else None

    def scope(self, principal: Principal, instance: Instance | None = None) -> RequestScope:
        """A request's scope on ``instance`` (``None``: the default instance)."""
        return RequestScope(principal, instance if instance is not None else self.default)

    @property
    def adapter(self) -> Adapter | None:
        """The default instance's adapter while it is ready; never starts it."""
        instance = self.default
        return instance.peek() if instance is not None else None

    @property
    def model(self) -> ModelManifest | None:
        instance = self.default
        return instance.manifest if instance is not None else None

    def close(self) -> None:
        if self.deployments is not None:
            self.deployments.close()
