"""Which instance serves the current request: the deployment set plus a per-request selection.

The HTTP layer selects an instance for each request (``X-Werk-Deployment`` on control routes,
``model`` on ``/v1`` and chat planning; docs/deployments.md, "Routing") and runs the request
inside :meth:`BackendRuntime.selecting`. Service code then asks for ``adapter`` (what the
selected instance has now, never starting it: discovery) or :meth:`BackendRuntime.started`
(starting a cold instance first: operations). Outside a request the default instance is
selected, which keeps a single-model host exactly as simple as before.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar, Token

from werk_host.backend import Adapter
from werk_host.config import HostConfig
from werk_host.deployments.instances import Instance
from werk_host.deployments.profile import DeploymentProfile
from werk_host.deployments.registry import DeploymentSet
from werk_host.errors import ErrorCode, WerkError
from werk_host.hooks import BackendHooks
from werk_host.models import ModelManifest
from werk_host.plugins import PluginHost

log = logging.getLogger(__name__)

_selected: ContextVar[Instance | None] = ContextVar("werk_selected_instance", default=None)
#: The instances the current request uses, held in flight until it ends (see :meth:`BackendRuntime.using`).
_in_use: ContextVar[list[Instance] | None] = ContextVar("werk_instances_in_use", default=None)


def _no_backend(what: str) -> WerkError:
    return WerkError(ErrorCode.UNSUPPORTED, f"{what} is not supported: no backend adapter is active")


class BackendRuntime:
    """The plugin host, its typed hook facade, and the deployment set (or none)."""

    def __init__(self, plugins: PluginHost, config: HostConfig) -> None:
        self.plugins = plugins
        self.hooks = BackendHooks(plugins)
        self.config = config
        self.deployments: DeploymentSet | None = None

    def deploy(self, profile: DeploymentProfile) -> DeploymentSet:
        """Build the instances of ``profile`` (every backend resolved, or ``ProfileError``) and
        preload the ``preload`` ones; a preload failure stays on its instance."""
        deployments = DeploymentSet(profile, self.plugins, self.config)
        self.deployments = deployments
        deployments.start()
        return deployments

    # -- selection -----------------------------------------------------------------------
    @contextmanager
    def selecting(self, instance: Instance | None) -> Iterator[None]:
        """Run the body with ``instance`` selected (``None``: the default instance)."""
        token = _selected.set(instance)
        try:
            yield
        finally:
            _selected.reset(token)

    def select(self, instance: Instance) -> Token[Instance | None]:
        """Select ``instance`` until :meth:`unselect` (for middleware that cannot use ``with``)."""
        return _selected.set(instance)

    def unselect(self, token: Token[Instance | None]) -> None:
        _selected.reset(token)

    @property
    def instance(self) -> Instance | None:
        """The selected instance, or the default one; ``None`` when nothing is deployed."""
        chosen = _selected.get()
        if chosen is not None:
            return chosen
        return self.deployments.default if self.deployments is not None else None

    @property
    def adapter(self) -> Adapter | None:
        """The selected instance's adapter while it is ready; never starts it."""
        instance = self.instance
        return instance.peek() if instance is not None else None

    @property
    def model(self) -> ModelManifest | None:
        instance = self.instance
        return instance.manifest if instance is not None else None

    def started(self) -> Adapter | None:
        """The selected instance's adapter, starting the instance when it is cold (an operation
        is about to use it); ``None`` when nothing is deployed. Inside :meth:`using`, the instance
        counts as in flight until the request ends, so keep-alive cannot stop it mid-request."""
        instance = self.instance
        if instance is None:
            return None
        held = _in_use.get()
        if held is not None and instance not in held:
            instance.enter()
            held.append(instance)
        return instance.use()

    def using(self) -> Token[list[Instance] | None]:
        """Start a request's scope: instances it uses stay in flight until :meth:`done`."""
        return _in_use.set([])

    def done(self, token: Token[list[Instance] | None]) -> None:
        held = _in_use.get() or []
        _in_use.reset(token)
        for instance in held:
            instance.leave()

    def require_adapter(self, what: str) -> Adapter:
        adapter = self.started()
        if adapter is None:
            raise _no_backend(what)
        return adapter

    def model_ids(self) -> set[str]:
        model = self.model
        return {model.name} if model is not None else set()

    def close(self) -> None:
        if self.deployments is not None:
            self.deployments.close()
