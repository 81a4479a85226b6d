"""Plugin discovery, tolerant loading, inventory and owner-only hook dispatch.

Plugins are modules named by entry points in the group ``werk``. A plugin that fails to
import is recorded with its error and skipped; it never crashes the host. Operators can
disable plugins with ``WERK_DISABLE_PLUGINS=name,name`` (``*`` disables all).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points
from typing import Any

import pluggy
from stevedore import NamedExtensionManager

from werk_host import hookspecs
from werk_host.backend import Adapter, AdapterFactory
from werk_host.errors import ErrorCode, WerkError

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "werk"


@dataclass
class PluginRecord:
    """Inventory entry for one discovered plugin."""

    name: str
    distribution: str | None
    version: str | None
    status: str  # "loaded", "failed", "disabled"
    hooks: list[str] = field(default_factory=list)
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "distribution": self.distribution,
            "version": self.version,
            "status": self.status,
            "hooks": self.hooks,
            "error": self.error,
        }


def disabled_plugin_names(environ: dict[str, str] | None = None) -> set[str]:
    raw = (environ if environ is not None else os.environ).get("WERK_DISABLE_PLUGINS", "")
    return {part.strip() for part in raw.split(",") if part.strip()}


def _dist_of(entry_point: EntryPoint) -> tuple[str | None, str | None]:
    dist = getattr(entry_point, "dist", None)
    if dist is None:
        return None, None
    return dist.metadata["Name"], dist.version


class PluginHost:
    """Owns the pluggy manager: loading, inventory and dispatch to an adapter's owner."""

    def __init__(self) -> None:
        self.pm = pluggy.PluginManager("werk")
        self.pm.add_hookspecs(hookspecs)
        self.records: list[PluginRecord] = []
        self._subset_cache: dict[tuple[str, str], Any] = {}
        self._lock = threading.Lock()

    # -- loading -------------------------------------------------------------------------
    def load_entry_points(self, environ: dict[str, str] | None = None) -> None:
        """Discover and register every plugin of the ``werk`` entry-point group.

        Disabled plugins are listed but never imported; a plugin that fails to import is
        listed as ``failed`` with its error.
        """
        disabled = disabled_plugin_names(environ)
        found = {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}
        enabled = [n for n in sorted(found) if "*" not in disabled and n not in disabled]
        for name in sorted(set(found) - set(enabled)):
            dist, version = _dist_of(found[name])
            self.records.append(PluginRecord(name, dist, version, "disabled"))
        failures: dict[str, BaseException] = {}

        def on_failure(_mgr: object, entry_point: EntryPoint, err: BaseException) -> None:
            failures[entry_point.name] = err

        manager: NamedExtensionManager[Any] = NamedExtensionManager(
            namespace=ENTRY_POINT_GROUP,
            names=enabled,
            invoke_on_load=False,
            on_load_failure_callback=on_failure,
        )
        for ext in manager.extensions:
            dist, version = _dist_of(found[ext.name])
            self.register(ext.plugin, ext.name, distribution=dist, version=version)
        for name, err in sorted(failures.items()):
            dist, version = _dist_of(found[name])
            error = f"{type(err).__name__}: {err}"
            log.error("plugin %s failed to load: %s", name, error)
            self.records.append(PluginRecord(name, dist, version, "failed", error=error))

    def register(
        self, plugin: object, name: str, *, distribution: str | None = None, version: str | None = None
    ) -> None:
        """Register a plugin object (module or instance) under ``name``; tolerant of errors."""
        try:
            self.pm.register(plugin, name=name)
            self.pm.check_pending()
        except Exception as err:  # a broken plugin must not take the host down
            if self.pm.get_plugin(name) is not None:
                self.pm.unregister(name=name)
            log.error("plugin %s rejected: %s", name, err)
            self.records.append(
                PluginRecord(name, distribution, version, "failed", error=f"{type(err).__name__}: {err}")
            )
            return
        hooks = sorted(h.name for h in self.pm.get_hookcallers(plugin) or [])
        self.records.append(PluginRecord(name, distribution, version, "loaded", hooks=hooks))
        self._subset_cache.clear()

    def inventory(self) -> list[dict[str, Any]]:
        return [r.as_dict() for r in sorted(self.records, key=lambda r: r.name)]

    # -- adapters ------------------------------------------------------------------------
    def adapter_factories(self, config: Any) -> list[AdapterFactory]:
        factories: list[AdapterFactory] = []
        for offered in self.pm.hook.werk_adapter_factories(config=config):
            factories.extend(offered or [])
        return factories

    def _owner_caller(self, hook_name: str, owner: str) -> Any:
        key = (hook_name, owner)
        with self._lock:
            caller = self._subset_cache.get(key)
            if caller is None:
                others = [
                    plugin
                    for name, plugin in self.pm.list_name_plugin()
                    if name != owner and self._provides_adapters(plugin)
                ]
                caller = self.pm.subset_hook_caller(hook_name, remove_plugins=others)
                self._subset_cache[key] = caller
            return caller

    def _provides_adapters(self, plugin: object) -> bool:
        return any(h.name == "werk_adapter_factories" for h in self.pm.get_hookcallers(plugin) or [])

    def call(self, hook_name: str, adapter: Adapter, **kwargs: Any) -> Any:
        """Call operation hook ``hook_name`` on ``adapter``'s owning plugin only.

        Plugins providing no adapters (cross-cutting wrappers) still see the call.
        Returns the hook's result; ``None`` means the owner does not implement it.
        """
        if hook_name not in hookspecs.OPERATION_HOOKS:
            raise ValueError(f"{hook_name} is not an operation hook")
        caller = self._owner_caller(hook_name, adapter.plugin_name)
        return caller(adapter=adapter, **kwargs)

    def require(self, hook_name: str, adapter: Adapter | None, what: str, **kwargs: Any) -> Any:
        """Like :meth:`call` but raise ``unsupported`` when there is no adapter or no answer."""
        if adapter is None:
            raise WerkError(ErrorCode.UNSUPPORTED, f"{what} is not supported: no backend adapter is active")
        result = self.call(hook_name, adapter, **kwargs)
        if result is None:
            raise WerkError(ErrorCode.UNSUPPORTED, f"{what} is not supported by backend {adapter.backend}")
        return result


def hook_names() -> Iterable[str]:
    """Every hook name declared in :mod:`werk_host.hookspecs`."""
    return sorted(n for n in dir(hookspecs) if n.startswith("werk_"))
