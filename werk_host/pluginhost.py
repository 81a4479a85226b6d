"""Plugin discovery, tolerant loading, inventory, ownership and operation dispatch.

Plugins are modules named by entry points in the group ``werk``. Before a plugin is imported,
its distribution's declared ``werk-host`` requirement is checked against the running host
(the hook API version, :data:`werk_host.hookspecs.HOOK_API_VERSION`): an incompatible or
undeclared range lists the plugin as ``failed`` with the reason, and it is never imported. A
plugin that fails to import is recorded with its error and skipped; it never crashes the host.
Operators can disable plugins with ``WERK_DISABLE_PLUGINS=name,name`` (``*`` disables all).
To build the ``werk`` parser the host loads, by the same rules, only each plugin's command
module, named in the group ``werk.cli`` (:meth:`PluginHost.load_cli_entry_points`), and
collects ``werk_cli_commands`` from it; a hook that raises adds no command and is flagged.
Ownership is derived (docs/plugin-hooks.md, "Ownership"): a factory belongs to the plugin
whose ``werk_adapter_factories`` returned it, and so does every adapter it creates. A factory
or adapter naming another plugin makes the plugin ``failed`` (:meth:`PluginHost.fail`): it is
unregistered with its adapters and answers nothing.

Operation dispatch has one route (docs/architecture.md, "Operation dispatch"): operations are
methods of the adapter class. Every registered plugin object, installed or registered in
process, that offers adapter factories and implements an operation hook itself, not as a
wrapper (the hook API 0.2 form), is ``failed`` when it registers. Each adapter an instance
creates gets a pluggy manager of its own (:meth:`PluginHost.attach`, dropped by
:meth:`PluginHost.detach` when it closes) holding the hookspecs, the cross-cutting plugins
(those that implement operation hooks, as wrappers: audit, metrics) and the adapter's hookimpl
methods; a plugin registered later joins every live adapter's manager. A call on adapter X runs
the implementation list of X's own manager, copied when the call starts. A list of one plain
implementation (no wrapper registered, the common case) is called directly, exactly as
pluggy's ``_multicall`` calls it (its arguments by name, its result or exception the call's);
any other list runs through pluggy's ``PluginManager._hookexec``: private API (measured 2.1 µs
a call against 2.7 µs through the public ``pm.hook.<name>(...)``, whose per-call argument
checks make the difference; the direct call saves another 0.9 µs of ``_multicall`` and about
1 µs of a served count_tokens, bench/control_load.py), so pyproject.toml pins pluggy to 1.x and
tests/test_plugins.py fails loudly if that method changes and checks the direct call answers
exactly as pluggy's.
Host code calls operation hooks through :class:`werk_host.hooks.BackendHooks`, never here by
name (docs/plugin-hooks.md).
"""

from __future__ import annotations

import argparse
import inspect
import logging
import os
import threading
from dataclasses import dataclass, field, replace
from importlib.metadata import Distribution, EntryPoint, entry_points

import pluggy
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version
from pluggy import HookImpl
from stevedore import ExtensionManager, NamedExtensionManager

from werk_host import __version__, hookspecs
from werk_host.config import HostConfig
from werk_host.errors import ErrorCode, WerkError
from werk_host.protocol.discovery import CapabilityId
from werk_host.seam import Adapter, AdapterFactory, DoctorCheck

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "werk"
#: Entry points naming each plugin's small command module (``werk_cli_commands``), by plugin name.
CLI_ENTRY_POINT_GROUP = "werk.cli"


@dataclass
class PluginRecord:
    """Inventory entry for one discovered plugin."""

    name: str
    distribution: str | None
    version: str | None
    status: str  # "loaded", "failed", "disabled"
    hooks: list[str] = field(default_factory=list)
    error: str | None = None
    problems: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "distribution": self.distribution,
            "version": self.version,
            "status": self.status,
            "hooks": self.hooks,
            "error": self.error,
            "problems": self.problems,
        }


def disabled_plugin_names(environ: dict[str, str] | None = None) -> set[str]:
    raw = (environ if environ is not None else os.environ).get("WERK_DISABLE_PLUGINS", "")
    return {part.strip() for part in raw.split(",") if part.strip()}


def _dist_of(entry_point: EntryPoint) -> tuple[str | None, str | None]:
    dist = getattr(entry_point, "dist", None)
    if dist is None:
        return None, None
    return dist.metadata["Name"], dist.version


HOST_DISTRIBUTION = "werk-host"


def incompatibility(dist: Distribution | None, host_version: str = __version__) -> str | None:
    """Why a plugin distribution cannot load into this host, or ``None`` when it can.

    The distribution must require ``werk-host`` with a version range that contains the
    running host's version (prereleases included); a requirement without a range accepts
    every host. Environment markers that do not apply are ignored.
    """
    if dist is None:
        return None
    ranges = []
    for line in dist.requires or []:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if canonicalize_name(req.name) != HOST_DISTRIBUTION:
            continue
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        ranges.append(req.specifier)
    api = f"hook API {hookspecs.HOOK_API_VERSION}"
    if not ranges:
        return (
            f"declares no {HOST_DISTRIBUTION} requirement; a plugin for {api} must require "
            f"{HOST_DISTRIBUTION}>={hookspecs.HOOK_API_VERSION}"
        )
    try:
        version = Version(host_version)
    except InvalidVersion:
        return None
    for spec in ranges:
        if not spec.contains(version, prereleases=True):
            return f"requires {HOST_DISTRIBUTION}{spec}, but this host is {host_version} ({api})"
    return None


class _AdapterPlugin:
    """What the host registers for one adapter: the adapter's hookimpl methods, bound, in a
    plugin manager of its own (the hookspecs, then every cross-cutting plugin and this stand-in,
    in registration order). A stand-in compared by identity, so two adapters that compare equal
    (dataclasses) still register as two plugins; pluggy's ``impl.function`` is the adapter's own
    method. ``hooks`` holds the manager's hook callers by name."""

    def __init__(self, adapter: Adapter, owner: str, crosscutting: list[tuple[str, object]]) -> None:
        self.adapter = adapter
        self.owner = owner
        for name in dir(type(adapter)):
            member = inspect.getattr_static(adapter, name, None)
            if inspect.isfunction(member) and hasattr(member, _IMPL_MARK):
                setattr(self, name, getattr(adapter, name))
        self.pm = pluggy.PluginManager(_PROJECT)
        self.pm.add_hookspecs(hookspecs)
        for plugin_name, plugin in crosscutting:
            self.pm.register(plugin, name=plugin_name)
        self.pm.register(self, name=f"{owner}/adapter-{id(self):x}")
        self.pm.check_pending()
        self.hooks: dict[str, pluggy.HookCaller] = {name: getattr(self.pm.hook, name) for name in OPERATION_HOOKS}

    def operations(self) -> set[str]:
        """The operation hooks the adapter's own methods implement."""
        return {caller.name for caller in self.pm.get_hookcallers(self) or []} & OPERATION_HOOKS


_PROJECT = "werk"
_IMPL_MARK = f"{_PROJECT}_impl"


def _module_operations(plugin: object, hooks: list[str]) -> str:
    kind = "module" if inspect.ismodule(plugin) else "object"
    return (
        f"its plugin {kind} implements operation hooks itself ({', '.join(hooks)}), the hook API 0.2 "
        "form: since 0.3 each operation is a method of its adapter class, @hookimpl(specname=...)"
    )


def _misnamed(what: str, backend: str, said: str, owner: str) -> str:
    return (
        f"its {what} for backend {backend} says plugin_name {said!r}, but the plugin is installed as "
        f"{owner!r} (its entry point): the host derives the owner, so drop plugin_name or make it {owner!r}"
    )


class PluginHost:
    """Owns the pluggy manager: loading, inventory and dispatch to an adapter's owner."""

    def __init__(self) -> None:
        self.pm = pluggy.PluginManager("werk")
        self.pm.add_hookspecs(hookspecs)
        self.records: list[PluginRecord] = []
        self._adapters: dict[int, _AdapterPlugin] = {}
        #: adapters of failed plugins, with their owner: held, so that their ids are not reused
        self._refused: dict[int, tuple[Adapter, str]] = {}
        #: registered plugins that implement operation hooks (wrappers), in registration order
        self._crosscutting: list[tuple[str, object]] = []
        self._lock = threading.Lock()
        self._operations = 0

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
        for name in list(enabled):
            reason = incompatibility(getattr(found[name], "dist", None))
            if reason is not None:
                enabled.remove(name)
                dist, version = _dist_of(found[name])
                log.error("plugin %s not loaded: %s", name, reason)
                self.records.append(PluginRecord(name, dist, version, "failed", error=reason))
        failures: dict[str, BaseException] = {}

        def on_failure(_mgr: object, entry_point: EntryPoint, err: BaseException) -> None:
            failures[entry_point.name] = err

        # stevedore remembers a namespace's entry points per process; drop that memory so this
        # load sees exactly what importlib.metadata found above (plugins installed meanwhile).
        ExtensionManager.ENTRY_POINT_CACHE.pop(ENTRY_POINT_GROUP, None)
        manager: NamedExtensionManager[object] = NamedExtensionManager(
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
        """Register a plugin object (module or instance) under ``name``; tolerant of errors.

        A plugin that offers adapter factories and implements an operation hook itself, not as
        a wrapper (the hook API 0.2 form), is ``failed`` (:meth:`fail`); any other plugin that
        implements operation hooks takes part in every adapter's calls from now on."""
        if self.pm.is_blocked(name):
            return  # failed earlier (:meth:`fail`)
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
        callers = self.pm.get_hookcallers(plugin) or []
        self.records.append(PluginRecord(name, distribution, version, "loaded", hooks=sorted(h.name for h in callers)))
        own = _own_operations(plugin, callers)
        if own:
            self.fail(name, _module_operations(plugin, own))
        elif any(caller.name in OPERATION_HOOKS for caller in callers):
            with self._lock:
                self._crosscutting.append((name, plugin))
                for adapter in self._adapters.values():
                    adapter.pm.register(plugin, name=name)

    def load_cli_entry_points(self, environ: dict[str, str] | None = None) -> list[tuple[str, str]]:
        """Register each plugin's command module (group ``werk.cli``), for ``werk``'s parser only.

        Disabled and incompatible plugins are skipped unimported, as in :meth:`load_entry_points`.
        Returns ``(plugin, problem)`` for each command module that failed to import (also
        recorded as ``failed``)."""
        disabled = disabled_plugin_names(environ)
        problems: list[tuple[str, str]] = []
        for ep in sorted(entry_points(group=CLI_ENTRY_POINT_GROUP), key=lambda e: e.name):
            if "*" in disabled or ep.name in disabled or self.pm.get_plugin(ep.name) is not None:
                continue
            if incompatibility(getattr(ep, "dist", None)) is not None:
                continue  # `werk plugins` lists why
            dist, version = _dist_of(ep)
            try:
                module = ep.load()
            except Exception as err:  # a broken plugin must not take `werk` down
                error = f"{type(err).__name__}: {err}"
                self.records.append(PluginRecord(ep.name, dist, version, "failed", error=error))
                problems.append((ep.name, f"commands failed to load: {error}"))
                continue
            self.register(module, ep.name, distribution=dist, version=version)
        return problems

    def add_cli_commands(
        self, subparsers: argparse._SubParsersAction[argparse.ArgumentParser]
    ) -> list[tuple[str, str]]:
        """Call every registered plugin's ``werk_cli_commands`` on ``werk``'s sub-commands.

        Each plugin is called on its own: one that raises (a taken command name included) has
        whatever it added removed, is flagged, and the others still add theirs. Returns the
        ``(plugin, problem)`` pairs flagged."""
        names = {id(plugin): name for name, plugin in self.pm.list_name_plugin()}
        problems: list[tuple[str, str]] = []
        for impl in self.pm.hook.werk_cli_commands.get_hookimpls():
            if impl.wrapper or impl.hookwrapper:
                continue
            name = names.get(id(impl.plugin), impl.plugin_name)
            taken = set(subparsers._name_parser_map)
            listed = len(subparsers._choices_actions)
            try:
                impl.function(*[{"subparsers": subparsers}[a] for a in impl.argnames])
            except Exception as err:  # a broken plugin must not take `werk` down
                for added in set(subparsers._name_parser_map) - taken:
                    del subparsers._name_parser_map[added]
                del subparsers._choices_actions[listed:]
                problem = f"werk_cli_commands raised {type(err).__name__}: {err}"
                with self._lock:  # not :meth:`flag`: its log line would repeat what `werk` prints
                    for record in self.records:
                        if record.name == name and problem not in record.problems:
                            record.problems.append(problem)
                problems.append((name, problem))
        return problems

    def inventory(self) -> list[dict[str, object]]:
        return [r.as_dict() for r in sorted(self.records, key=lambda r: r.name)]

    def flag(self, plugin_name: str, problem: str) -> None:
        """Record a defect observed in a loaded plugin (listed by ``werk plugins``), once."""
        with self._lock:
            for record in self.records:
                if record.name == plugin_name and problem not in record.problems:
                    record.problems.append(problem)
                    log.warning("plugin %s %s", plugin_name, problem)

    # -- adapters ------------------------------------------------------------------------
    def adapter_factories(self, config: HostConfig) -> list[AdapterFactory]:
        """Every factory offered by a loaded plugin; malformed offers are flagged and skipped,
        and declared capability ids that are not :class:`CapabilityId` members are flagged."""
        factories: list[AdapterFactory] = []
        # the order pluggy calls them in (last registered first), each paired with its plugin
        for impl in reversed(self.pm.hook.werk_adapter_factories.get_hookimpls()):
            if impl.wrapper or impl.hookwrapper:
                continue
            owner = impl.plugin_name
            offered = impl.function(*[{"config": config}[a] for a in impl.argnames])
            own: list[AdapterFactory] = []
            for factory in offered if isinstance(offered, list | tuple) else []:
                if not isinstance(factory, AdapterFactory):
                    log.error("a plugin offered %s instead of an AdapterFactory; ignored", type(factory).__name__)
                    continue
                if factory.plugin_name is not None and factory.plugin_name != owner:
                    self.fail(owner, _misnamed("factory", factory.backend, factory.plugin_name, owner))
                    own = []
                    break
                for cap_id in factory.capabilities:
                    if cap_id not in CapabilityId.__members__.values():
                        self.flag(owner, f"declares unknown capability id {cap_id!r}")
                own.append(replace(factory, plugin_name=owner))
            factories += own
        return factories

    def fail(self, plugin_name: str, reason: str) -> None:
        """Take a loaded plugin out: it and every adapter it created are unregistered (they
        answer no operation, its factories are not offered again) and ``werk plugins`` lists it
        ``failed`` with ``reason``."""
        with self._lock:
            if self.pm.get_plugin(plugin_name) is not None:
                self.pm.set_blocked(plugin_name)
            for key, plugin in list(self._adapters.items()):
                if plugin.owner == plugin_name:
                    self._refused[key] = (plugin.adapter, plugin_name)
                    del self._adapters[key]
                elif plugin.pm.get_plugin(plugin_name) is not None:
                    plugin.pm.unregister(name=plugin_name)
            self._crosscutting = [(n, p) for n, p in self._crosscutting if n != plugin_name]
            for record in self.records:
                if record.name == plugin_name and record.status == "loaded":
                    record.status, record.error, record.hooks = "failed", reason, []
        log.error("plugin %s failed: %s", plugin_name, reason)

    def doctor_checks(self, config: HostConfig) -> list[tuple[str, DoctorCheck]]:
        """Every loaded plugin's ``werk_doctor_checks``, each paired with the plugin's name, in
        plugin-name order. A plugin whose checks raise or return something other than a list of
        :class:`DoctorCheck` yields one ``fail`` check saying so (flagged, never raised)."""
        names = {id(plugin): name for name, plugin in self.pm.list_name_plugin()}
        found: list[tuple[str, DoctorCheck]] = []
        impls = self.pm.hook.werk_doctor_checks.get_hookimpls()
        args = {"config": config}
        for impl in sorted(impls, key=lambda i: names.get(id(i.plugin), i.plugin_name)):
            if impl.wrapper or impl.hookwrapper:
                continue
            name = names.get(id(impl.plugin), impl.plugin_name)
            try:
                offered = impl.function(*[args[a] for a in impl.argnames])
            except Exception as err:  # a broken check must not stop the others
                log.error("plugin %s doctor checks raised: %s", name, err, exc_info=True)
                offered = f"raised {type(err).__name__}: {err}"
            if not isinstance(offered, list) or not all(isinstance(c, DoctorCheck) for c in offered):
                problem = offered if isinstance(offered, str) else "returned something other than DoctorCheck items"
                self.flag(name, f"doctor checks {problem}")
                fix = f"report it to the plugin's authors, or disable it: WERK_DISABLE_PLUGINS={name}"
                offered = [DoctorCheck(f"{name}.checks", "fail", f"its doctor checks {problem}", fix)]
            found.extend((name, check) for check in offered)
        return found

    # -- adapters as plugins (docs/architecture.md, "Operation dispatch") ----------------
    def attach(self, adapter: Adapter, factory: AdapterFactory) -> None:
        """Register a new ``adapter`` that ``factory`` created: its hookimpl methods answer the
        operation calls made on it from now on. Safe while other threads call hooks."""
        self._attach(adapter, factory.owner)

    def _attach(self, adapter: Adapter, owner: str) -> _AdapterPlugin:
        said = getattr(adapter, "plugin_name", None)
        if said is not None and said != owner:
            self.fail(owner, _misnamed("adapter", adapter.backend, str(said), owner))
        if self.pm.is_blocked(owner):
            with self._lock:
                self._refused[id(adapter)] = (adapter, owner)
            raise WerkError(ErrorCode.INTERNAL, f"plugin {owner} failed; werk plugins says why")
        with self._lock:
            known = self._adapters.get(id(adapter))
            if known is not None and known.adapter is adapter:
                return known
            plugin = _AdapterPlugin(adapter, owner, self._crosscutting)
            self._adapters[id(adapter)] = plugin
        return plugin

    def detach(self, adapter: Adapter) -> None:
        """Unregister a closing ``adapter`` (:meth:`attach`); nothing when it was not attached."""
        with self._lock:
            plugin = self._adapters.get(id(adapter))
            if plugin is not None and plugin.adapter is adapter:
                del self._adapters[id(adapter)]

    def owner_of(self, adapter: Adapter) -> str:
        """The name of the plugin whose factory created ``adapter``. An adapter the host did not
        attach (built by hand) is owned by the plugin its ``plugin_name`` attribute names."""
        plugin = self._adapters.get(id(adapter))
        if plugin is not None and plugin.adapter is adapter:
            return plugin.owner
        said = getattr(adapter, "plugin_name", None)
        return said if isinstance(said, str) else ""

    def operations_of(self, adapter: Adapter) -> set[str]:
        """The operation hooks ``adapter``'s own methods implement."""
        return self._plugin(adapter).operations()

    def _plugin(self, adapter: Adapter) -> _AdapterPlugin:
        plugin = self._adapters.get(id(adapter))
        if plugin is not None and plugin.adapter is adapter:
            return plugin
        refused, owner = self._refused.get(id(adapter), (None, ""))
        if refused is adapter:
            raise WerkError(ErrorCode.INTERNAL, f"plugin {owner} failed; werk plugins says why")
        return self._attach(adapter, self.owner_of(adapter))  # built by hand (a test): attached on first use

    def dispatch(self, hook_name: str, adapter: Adapter, **kwargs: object) -> object:
        """Call operation hook ``hook_name`` on ``adapter`` through its own plugin manager: its
        own implementations plus those of cross-cutting plugins (wrappers), untyped.

        Returns the hook's raw result (``None``: the adapter does not implement it). Host code
        uses the typed :class:`werk_host.hooks.BackendHooks` instead of calling this directly.
        """
        plugin = self._adapters.get(id(adapter))  # a dict read is atomic; attaching takes the lock
        if plugin is None or plugin.adapter is not adapter:
            plugin = self._plugin(adapter)
        hook = plugin.hooks.get(hook_name)
        if hook is None:
            raise ValueError(f"{hook_name} is not an operation hook")
        kwargs["adapter"] = adapter
        impls = hook.get_hookimpls()  # a copy: a plugin registering meanwhile joins later calls only
        if hook_name in OBSERVING_HOOKS:
            return _call(plugin.pm, hook_name, impls, kwargs)
        try:
            return _call(plugin.pm, hook_name, impls, kwargs)
        finally:
            with self._lock:
                self._operations += 1

    def operations(self) -> int:
        """How many calls of hooks outside :data:`OBSERVING_HOOKS` have returned or raised so far.

        Evidence a backend reports (a probe that ran, a process that started) changes through
        those calls or with time; discovery reuses a report only while this count is unchanged
        (:mod:`werk_host.service.capabilities`)."""
        return self._operations


def _call(pm: pluggy.PluginManager, hook_name: str, impls: list[HookImpl], kwargs: dict[str, object]) -> object:
    """One firstresult call of ``impls`` (every operation hook is firstresult,
    werk_host/hookspecs.py), as pluggy's ``_multicall`` makes it: one plain implementation (no
    wrapper registered: the common case) is called directly with its arguments, as pluggy
    would call it, and its result or exception is the call's; otherwise pluggy's private
    ``_hookexec`` runs the list (the module docstring says why; both measured in
    docs/architecture.md, "Operation dispatch")."""
    if len(impls) == 1:
        impl = impls[0]
        if not (impl.wrapper or impl.hookwrapper):
            return impl.function(*[kwargs[name] for name in impl.argnames])
    return pm._hookexec(hook_name, impls, kwargs, True)


def _own_operations(plugin: object, callers: list[pluggy.HookCaller]) -> list[str]:
    """The operation hooks ``plugin`` implements itself (not as a wrapper) when it also offers
    adapter factories: the hook API 0.2 form."""
    if hookspecs.werk_adapter_factories.__name__ not in {c.name for c in callers}:
        return []
    return sorted(
        c.name
        for c in callers
        if c.name in OPERATION_HOOKS
        and any(i.plugin is plugin and not (i.wrapper or i.hookwrapper) for i in c.get_hookimpls())
    )


def hook_names() -> list[str]:
    """Every hook name declared in :mod:`werk_host.hookspecs`."""
    return sorted(n for n in dir(hookspecs) if n.startswith("werk_") and callable(getattr(hookspecs, n)))


#: Hooks that take an adapter and are dispatched to its owning plugin only.
OPERATION_HOOKS: frozenset[str] = frozenset(hook_names()) - {
    hookspecs.werk_adapter_factories.__name__,
    hookspecs.werk_doctor_checks.__name__,
    hookspecs.werk_cli_commands.__name__,
}
#: Operation hooks that only observe (their contracts say "cheap", "side-effect free" or
#: "read-only"); every other operation hook may change what a backend reports.
OBSERVING_HOOKS: frozenset[str] = frozenset(
    spec.__name__
    for spec in (
        hookspecs.werk_capabilities,
        hookspecs.werk_compat_key,
        hookspecs.werk_count_tokens,
        hookspecs.werk_chat_limits,
        hookspecs.werk_reasoning_profile,
        hookspecs.werk_workers,
        hookspecs.werk_memory_requirement,
        hookspecs.werk_deployment_plan,
        hookspecs.werk_list_experts,
        hookspecs.werk_prompt_cache,
    )
)
