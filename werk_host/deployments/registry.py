"""The instances and aliases one host serves, and how a request finds its instance.

Selection rules (docs/deployments.md, "Routing"):

* Control routes (``/werk/v1``) select with ``X-Werk-Deployment: <instance-id>``: an alias there
  is ``invalid_request`` (aliases are not control targets), an unknown id ``not_found``; without
  the header, the profile's default instance.
* ``/v1`` and the chat-planning routes select by ``model``: an instance id, a model name served
  by instances, or an alias; Ollama's default tag ``:latest`` on a name that is none of
  these is dropped (on every route: ``/v1``, ``/v1/messages``, ``/v1/responses``, ``/api``).
  An alias (or a model served by several instances) picks a ready replica with the fewest
  requests in flight, ties broken round-robin, skipping replicas whose start failed recently;
  when all are down the answer is a retryable 503. Planning requests (``advance=False``) look
  without moving the round-robin.

Every instance's backend is resolved when the set is built, so a profile that names a model no
installed plugin serves fails ``werk serve`` at start, before anything runs.
"""

from __future__ import annotations

import fnmatch
import itertools
import json
import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import replace

from pydantic import JsonValue

from werk_host.config import HostConfig
from werk_host.deployments.instances import Instance
from werk_host.deployments.observe import WorkerWatch
from werk_host.deployments.profile import (
    PROFILE_FILENAME,
    DeploymentProfile,
    InstanceSpec,
    ProfileError,
    load_profile,
    profile_from_models,
)
from werk_host.deployments.residency import Residency
from werk_host.errors import ErrorCode, WerkError
from werk_host.hooks import BackendHooks
from werk_host.memory import MemoryManager
from werk_host.models import ModelManifest, ModelRegistry
from werk_host.pluginhost import PluginHost
from werk_host.protocol.deployments import InstanceStateName
from werk_host.seam import Adapter, AdapterFactory

log = logging.getLogger(__name__)

#: The request header selecting a control target, echoed on ``/v1`` answers with the instance
#: that served them.
DEPLOYMENT_HEADER = "X-Werk-Deployment"

#: How often the keep-alive sweeper looks for idle instances.
SWEEP_INTERVAL_S = 0.5
#: Ollama's default tag: ``NAME:latest`` names what ``NAME`` names (:meth:`DeploymentSet.replicas`).
LATEST_TAG = ":latest"


def profile_for(config: HostConfig) -> DeploymentProfile | None:
    """The profile ``werk serve`` runs: ``--profile``, else the ``--model`` shorthand, else
    ``WERK_HOME/deployments.toml`` when present, else none (a host with no backend)."""
    registry = ModelRegistry(config.home)

    def known(name: str) -> bool:
        return registry.get(name) is not None

    if config.profile is not None:
        return load_profile(config.profile, known_model=known)
    if config.served_models():
        return profile_from_models(config.served_models(), known_model=known)
    home_profile = config.home / PROFILE_FILENAME
    if home_profile.is_file():
        return load_profile(home_profile, known_model=known)
    return None


def choose_factory(
    factories: Iterable[AdapterFactory], manifest: ModelManifest, backend: str | None
) -> AdapterFactory | None:
    """The factory serving ``manifest`` (docs/plugin-kit.md, "Which backend serves a model"): the
    named backend (or the manifest's) when there is one; otherwise the one installed factory
    that accepts the model. ``None`` when none does; two or more accepting factories without an
    explicit backend are a :class:`BackendTie` naming them all (never a silent pick)."""
    wanted = backend or manifest.backend
    if wanted is not None:
        return next((f for f in factories if wanted in (f.backend, f.owner)), None)
    accepting = [f for f in factories if f.accepts(manifest)]
    if len(accepting) > 1:
        raise BackendTie(manifest.name, accepting)
    return accepting[0] if accepting else None


class BackendTie(ValueError):
    """More than one installed backend accepts a model and none was named."""

    def __init__(self, model: str, factories: list[AdapterFactory]) -> None:
        names = ", ".join(_named(f) for f in factories)
        super().__init__(
            f"model {model} is accepted by more than one installed backend ({names}); name one with "
            f'werk models add NAME PATH --backend NAME or the profile instance\'s backend = "NAME"'
        )


def _named(factory: AdapterFactory) -> str:
    return factory.backend if factory.backend == factory.owner else f"{factory.backend} (plugin {factory.owner})"


def installed_backends(factories: Iterable[AdapterFactory]) -> str:
    """What an unknown backend's error says: the backend ids the loaded plugins offer (with
    the plugin's name where it differs) and how to install another (``pip install werk-NAME``,
    docs/operations.md, "Start-up")."""
    named = (_named(f) for f in factories)
    offered = list(dict.fromkeys(named))
    have = f"installed backends: {', '.join(offered)}" if offered else "no backend plugin is installed"
    return f"{have}; install one with pip install werk-NAME, e.g. pip install werk-llamacpp"


def instance_config(config: HostConfig, factory: AdapterFactory, options: dict[str, JsonValue]) -> HostConfig:
    """``config`` with the instance's backend options laid over the server-wide ones."""
    if not options:
        return config
    merged = dict(config.backend_options)
    merged[factory.owner] = {**merged.get(factory.owner, {}), **options}
    return replace(config, backend_options=merged)


class DeploymentSet:
    """Instances by id, aliases, the default instance and the keep-alive sweeper."""

    def __init__(
        self,
        profile: DeploymentProfile,
        plugins: PluginHost,
        config: HostConfig,
        *,
        live_handoffs: Callable[[Instance], bool] = lambda _instance: False,
        expire_handoffs: Callable[[str], int] = lambda _identity: 0,
        on_ready: Callable[[Instance, Adapter], None] | None = None,
        memory: MemoryManager | None = None,
    ) -> None:
        self.profile = profile
        self._on_ready = on_ready
        registry = ModelRegistry(config.home)
        factories = plugins.adapter_factories(config)
        #: admission of every start (docs/deployments.md, "Residency limits")
        self.residency = Residency(
            profile.residency.with_max_loaded(config.max_loaded),
            live_handoffs=live_handoffs,
            expire_handoffs=expire_handoffs,
            memory=memory,
        )
        self._hooks = BackendHooks(plugins)
        self.instances: dict[str, Instance] = {}
        for spec in profile.instances:
            self.instances[spec.id] = self._instance(spec, registry, factories, config, plugins)
        self.residency.bind(self.instances)
        self.aliases: dict[str, tuple[str, ...]] = {k: tuple(v) for k, v in profile.aliases.items()}
        self.default_id = profile.default_instance.id
        self._turns: dict[str, itertools.count[int]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._sweeper: threading.Thread | None = None
        #: the inventory's worker observations, bounded against a hung backend
        self.watch = WorkerWatch()

    def _instance(
        self,
        spec: InstanceSpec,
        registry: ModelRegistry,
        factories: list[AdapterFactory],
        config: HostConfig,
        plugins: PluginHost,
    ) -> Instance:
        if spec.endpoint is not None:  # remote: the model is whatever the endpoint serves under that name
            manifest = ModelManifest(spec.model, (), spec.backend, {})
        else:
            try:
                manifest = registry.resolve(spec.model)
            except WerkError as err:
                raise ProfileError(f"{self.profile.source}: instance {spec.id}: {err.message}") from err
        try:
            factory = choose_factory(factories, manifest, spec.backend)
        except BackendTie as err:
            raise ProfileError(f"{self.profile.source}: instance {spec.id}: {err}") from err
        if factory is None:
            wanted = spec.backend or manifest.backend or "any installed backend"
            raise ProfileError(
                f"{self.profile.source}: instance {spec.id}: no installed backend plugin serves "
                f"model {manifest.name} ({wanted}); {installed_backends(factories)}"
            )
        options = dict(spec.options)
        if spec.endpoint is not None:
            options["endpoint"] = spec.endpoint
            if spec.api_key_env is not None:
                options["api_key_env"] = spec.api_key_env
        if factory.validate_options is not None:  # docs/deployments.md, "Validation"
            try:
                factory.validate_options(options)
            except ValueError as err:
                raise ProfileError(f"{self.profile.source}: instance {spec.id}: options: {err}") from err
        return Instance(
            spec,
            manifest,
            factory,
            instance_config(config, factory, options),
            room=self.residency,
            plugins=plugins,
            on_ready=self._on_ready,
        )

    # -- lifecycle -----------------------------------------------------------------------
    def start(self) -> None:
        """Preload the ``preload`` instances (a failure stays on that instance) and start the
        keep-alive sweeper. It runs even when the profile keeps every instance forever: a
        request may ask for a finite ``keep_alive`` (:meth:`Instance.hold`)."""
        for instance in self.instances.values():
            if instance.spec.preload:
                try:
                    instance.use()
                except WerkError as err:
                    log.error("preloading instance %s failed: %s", instance.id, err.message)
        self._sweeper = threading.Thread(target=self._sweep, name="werk-keep-alive", daemon=True)
        self._sweeper.start()

    def _sweep(self) -> None:
        while not self._stop.wait(SWEEP_INTERVAL_S):
            for instance in self.instances.values():
                try:
                    instance.stop_if_idle()
                    self._measure(instance)
                except Exception:
                    log.warning("keep-alive stop of instance %s failed", instance.id, exc_info=True)

    def _measure(self, instance: Instance) -> None:
        """Feed the memory estimate (werk_host/deployments/residency.py) the resident memory of a
        ready instance's processes, from the inventory's worker observation."""
        adapter = instance.peek()
        if adapter is None or instance.spec.endpoint is not None:
            return
        workers = self.watch.last(instance.id, adapter)
        if workers is None:
            workers = self.watch.observe(instance.id, adapter, self._hooks.workers) or []
        self.residency.measure(instance, [w.pid for w in workers if w.pid is not None])

    # -- operator actions (docs/deployments.md, "Operator actions") ------------------------
    def act(self, instance_id: str, action: str) -> Instance:
        """``load``, ``unload``, ``pin`` or ``unpin`` one instance, for an operator. ``unload``
        never stops an instance with requests in flight (409 ``conflict``); live handoffs do not
        hold an operator's unload (they answer 410 afterwards, as after any restart)."""
        instance = self.instances.get(instance_id)
        if instance is None:
            raise WerkError(ErrorCode.NOT_FOUND, "no deployment instance has that id")
        if action == "load":
            instance.use()
        elif action == "unload":
            if not instance.stop("unloaded by an operator") and instance.in_flight:
                raise WerkError(
                    ErrorCode.CONFLICT,
                    f"instance {instance.id} has requests in flight; unload it when they are done",
                    retryable=True,
                )
        elif action in ("pin", "unpin"):
            instance.pin(action == "pin")
        else:
            raise WerkError(ErrorCode.INVALID_REQUEST, "action must be load, unload, pin or unpin")
        return instance

    def close(self) -> None:
        self._stop.set()
        if self._sweeper is not None:
            self._sweeper.join(timeout=5)
        for instance in self.instances.values():
            try:
                instance.close()
            except Exception:
                log.warning("closing instance %s failed", instance.id, exc_info=True)

    # -- selection -----------------------------------------------------------------------
    @property
    def default(self) -> Instance:
        return self.instances[self.default_id]

    def control(self, header: str | None) -> Instance:
        """The instance an ``X-Werk-Deployment`` header selects (the default without one)."""
        if header is None:
            return self.default
        if header in self.aliases:
            raise WerkError(
                ErrorCode.INVALID_REQUEST,
                f"{header} is an alias; control requests select one instance id with X-Werk-Deployment",
            )
        instance = self.instances.get(header)
        if instance is None:
            raise WerkError(ErrorCode.NOT_FOUND, "no deployment instance has that id")
        return instance

    def replicas(self, name: str) -> tuple[Instance, ...]:
        """The instances a ``model`` value names (docs/deployments.md, "Routing"): an instance
        id, an alias, a model name, else the same without Ollama's default tag ``:latest``
        (``tiny:latest`` is ``tiny`` on every route; docs/compat.md, "Ollama"), else the first
        alias whose ``match`` pattern the name fits, else the profile's ``[routing] fallback``;
        empty when none does."""
        named = self._exact(name)
        if not named and name.endswith(LATEST_TAG):
            name = name.removesuffix(LATEST_TAG)
            named = self._exact(name)
        if named:
            return named
        for pattern, alias in self.profile.patterns:
            if fnmatch.fnmatchcase(name, pattern):
                return self._alias(alias)
        fallback = self.profile.fallback
        if fallback is None:
            return ()
        return self._alias(fallback) if fallback in self.aliases else (self.instances[fallback],)

    def _exact(self, name: str) -> tuple[Instance, ...]:
        """The instance with id ``name``, the alias ``name``'s, or those serving model ``name``."""
        if name in self.instances:
            return (self.instances[name],)
        if name in self.aliases:
            return self._alias(name)
        return tuple(i for i in self.instances.values() if i.manifest.name == name)

    def _alias(self, name: str) -> tuple[Instance, ...]:
        return tuple(self.instances[i] for i in self.aliases[name])

    def served_names(self) -> list[str]:
        """What a ``model`` value may name: instance ids, aliases, then model names."""
        names = [*self.instances, *self.aliases]
        return names + sorted({i.manifest.name for i in self.instances.values()} - set(names))

    def not_served(self, name: str) -> WerkError:
        """404 ``model_not_found`` naming the model asked for and what is served."""
        return WerkError(
            ErrorCode.NOT_FOUND,
            f"model {_shown(name)} is not served here (served: {', '.join(self.served_names())})",
            details={"openai_code": "model_not_found"},
        )

    def route(self, name: str | None, *, advance: bool = True) -> Instance:
        """The instance serving a request for ``name`` (the default instance for ``None``)."""
        if name is None:
            return self.default
        replicas = self.replicas(name)
        if not replicas:
            raise self.not_served(name)
        if len(replicas) == 1:
            return replicas[0]
        up = [r for r in replicas if not r.down()]
        if not up:
            raise WerkError(ErrorCode.UNAVAILABLE, f"every replica of {name} is unavailable", retryable=True)
        fewest = min(r.in_flight for r in up)
        tied = [r for r in up if r.in_flight == fewest]
        with self._lock:
            turn = self._turns.setdefault(name, itertools.count())
            index = next(turn) if advance else 0
        return tied[index % len(tied)]

    def states(self) -> dict[str, InstanceStateName]:
        return {i.id: i.view().state for i in self.instances.values()}


#: The most of a requested model name an error message repeats.
_SHOWN_MAX = 128


def _shown(name: str) -> str:
    """``name`` quoted for a message, cut to :data:`_SHOWN_MAX` characters."""
    cut = name if len(name) <= _SHOWN_MAX else name[:_SHOWN_MAX] + "..."
    return json.dumps(cut, ensure_ascii=False)
