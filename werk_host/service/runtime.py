"""The active backend: which adapter serves this host, chosen once at start-up."""

from __future__ import annotations

import logging
import threading

from werk_host.backend import Adapter
from werk_host.config import HostConfig
from werk_host.errors import ErrorCode, WerkError
from werk_host.hooks import BackendHooks
from werk_host.models import ModelManifest, ModelRegistry
from werk_host.plugins import PluginHost

log = logging.getLogger(__name__)


class BackendRuntime:
    """Holds the plugin host, its typed hook facade, the selected model manifest and the
    active adapter (or none)."""

    def __init__(self, plugins: PluginHost, config: HostConfig, adapter: Adapter | None = None) -> None:
        self.plugins = plugins
        self.hooks = BackendHooks(plugins)
        self.config = config
        self.model: ModelManifest | None = None
        self.adapter: Adapter | None = adapter
        self._lock = threading.Lock()

    def activate(self, model_ref: str | None = None, backend: str | None = None) -> Adapter | None:
        """Create the adapter for ``model_ref`` (a manifest name or a file path).

        The backend is the manifest's, ``backend`` if given, or the first factory that
        accepts the model. With no model and no backend, no adapter is activated.
        """
        manifest = ModelRegistry(self.config.home).resolve(model_ref) if model_ref else None
        wanted = backend or (manifest.backend if manifest else None)
        factories = self.plugins.adapter_factories(self.config)
        chosen = None
        for factory in factories:
            if wanted is not None and wanted not in (factory.backend, factory.plugin_name):
                continue
            if wanted is not None or factory.accepts(manifest):
                chosen = factory
                break
        if chosen is None:
            if manifest is None and wanted is None:
                return None
            raise WerkError(
                ErrorCode.UNSUPPORTED,
                f"no installed backend plugin can serve {wanted or (manifest.name if manifest else 'this model')}",
            )
        with self._lock:
            self.model = manifest
            self.adapter = chosen.create(self.config, manifest)
        log.info("active backend %s (%s)", chosen.backend, self.adapter.instance_id)
        return self.adapter

    def require_adapter(self, what: str) -> Adapter:
        adapter = self.adapter
        if adapter is None:
            raise WerkError(ErrorCode.UNSUPPORTED, f"{what} is not supported: no backend adapter is active")
        return adapter

    def model_ids(self) -> set[str]:
        return {self.model.name} if self.model else set()

    def close(self) -> None:
        with self._lock:
            adapter, self.adapter = self.adapter, None
        if adapter is not None:
            adapter.close()
