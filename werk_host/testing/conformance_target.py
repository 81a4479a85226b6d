"""The conformance suite's target and host: what a plugin hands the suite, how the suite loads
the plugin as a user's install does, and the running host it checks (werk_host.testing.conformance,
docs/plugin-kit.md, "Testing")."""

from __future__ import annotations

import http.client
import json
import os
import secrets
import tomllib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field, replace
from importlib.metadata import Distribution, EntryPoint, entry_points
from pathlib import Path
from types import ModuleType
from typing import cast

import pytest
from pydantic import JsonValue

from werk_host.config import HostConfig
from werk_host.models import ModelManifest, ModelRegistry
from werk_host.plugin.checkpoints import checkpoint_manifest
from werk_host.pluginhost import ENTRY_POINT_GROUP, PluginHost, incompatibility
from werk_host.protocol import CapabilityId, CapabilityStatus
from werk_host.seam import Adapter
from werk_host.server import Host, build_host
from werk_host.testing.api import Api
from werk_host.testing.hosts import running

__all__ = [
    "ConformanceHost",
    "ConformanceTarget",
    "entry_point_of",
    "environ_set",
    "load_target",
    "loaded_or_fail",
    "remote_profile",
    "served_target",
    "stream_answer",
]


@dataclass(frozen=True, kw_only=True)
class ConformanceTarget:
    """What a plugin hands the suite: its entry point and a model it can serve.

    ``entry_point`` is the plugin's entry-point name in the ``werk`` group; ``plugin`` (the
    module that entry point names) finds it instead, and ``plugin_name`` is the older spelling
    of ``entry_point``. A plugin object no entry point names (a test's own plugin class) is
    registered as ``plugin_name`` directly. ``model`` is a model file or a checkpoint
    directory (:func:`werk_host.plugin.checkpoints.checkpoint_manifest`, registered as
    ``model_name``) or a ready manifest. ``replace_process`` replaces the backend process of a
    live adapter (e.g. SIGKILL the child and wait for it to exit); without it the identity
    check is skipped with that reason. ``backend_options`` are the ``PLUGIN.KEY`` options.

    A remote backend (docs/plugin-kit.md, "Backends without local files") gives a manifest
    without files, its ``endpoint`` and, when the endpoint takes a key, ``api_key_env``; the
    suite deploys it as a remote instance. ``environ`` is set for the host's lifetime (the
    key's variable), and its values are secrets no message may carry. ``stop_backend(adapter)``
    is a context manager that takes the backend away while it is entered (kill the child, stop
    the remote server) and brings it back on exit; without it the error-path checks are skipped.
    """

    model: Path | ModelManifest
    entry_point: str | None = None
    plugin: object = None
    plugin_name: str | None = None
    model_name: str = "conformance-model"
    replace_process: Callable[[Adapter], None] | None = None
    backend_options: dict[str, dict[str, JsonValue]] = field(default_factory=dict)
    endpoint: str | None = None
    api_key_env: str | None = None
    environ: dict[str, str] = field(default_factory=dict)
    stop_backend: Callable[[Adapter], AbstractContextManager[object]] | None = None


@dataclass
class ConformanceHost:
    """The running host under test and everything the suite saw."""

    host: Host
    api: Api
    key: str
    model_name: str
    home: Path
    model_paths: tuple[str, ...]
    secrets: tuple[str, ...] = ()
    handoffs: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def adapter(self) -> Adapter:
        adapter = self.host.fleet.adapter
        assert adapter is not None, "the host activated no adapter for the target's model"
        return adapter

    def call(
        self, method: str, path: str, body: JsonValue = None, params: dict[str, str] | None = None
    ) -> tuple[int, dict[str, JsonValue]]:
        status, doc = self.api.call(method, path, body, params)
        if status >= 400:
            error = doc.get("error")
            if isinstance(error, dict):
                self.errors.append(str(error.get("message", "")))
        data = doc.get("data")
        if isinstance(data, dict):
            handoff = data.get("handoff")
            if isinstance(handoff, str):
                self.handoffs.append(handoff)
        return status, doc

    def statuses(self) -> dict[CapabilityId, CapabilityStatus]:
        status, doc = self.call("GET", "/werk/v1/capabilities")
        assert status == 200, doc
        listing = doc["data"]
        assert isinstance(listing, list)
        out: dict[CapabilityId, CapabilityStatus] = {}
        for entry in listing:
            assert isinstance(entry, dict)
            out[CapabilityId(str(entry["id"]))] = CapabilityStatus(str(entry["status"]))
        return out

    def probe_on_use(self, cap_id: CapabilityId) -> bool:
        report = (self.host.fleet.hooks.capabilities(self.adapter) or {}).get(cap_id)
        return report is not None and report.probe_on_use


def entry_point_of(target: ConformanceTarget) -> EntryPoint | None:
    """The installed ``werk`` entry point the target names, or whose module is ``target.plugin``."""
    name = target.entry_point or target.plugin_name
    module = getattr(target.plugin, "__name__", None) if isinstance(target.plugin, ModuleType) else None
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == name or (name is None and module is not None and ep.module == module):
            return ep
    return None


@dataclass(frozen=True)
class SourceTree:
    """A plugin run from its source tree, not installed: what its ``pyproject.toml`` declares."""

    name: str
    requires: list[str]


def source_tree(module: ModuleType) -> SourceTree | None:
    """The entry point naming ``module`` in the ``pyproject.toml`` of the tree that holds it."""
    for parent in Path(str(module.__file__)).resolve().parents:
        pyproject = parent / "pyproject.toml"
        if pyproject.is_file():
            project = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("project", {})
            for name, value in project.get("entry-points", {}).get(ENTRY_POINT_GROUP, {}).items():
                if str(value).split(":")[0].strip() == module.__name__:
                    return SourceTree(name, [str(r) for r in project.get("dependencies", [])])
            return None
    return None


def load_target(target: ConformanceTarget) -> tuple[PluginHost, str]:
    """A plugin host holding the target plugin alone, and the name it is loaded under: through
    its installed entry point (every other installed plugin disabled), as a user's install
    loads it. A plugin module run from its source tree (not installed, as ``plugins/_template``)
    is loaded under the entry-point name its ``pyproject.toml`` declares, after the same
    ``werk-host`` range check; a test's own plugin object is registered as ``plugin_name``."""
    plugins = PluginHost()
    name = target.entry_point or target.plugin_name
    ep = entry_point_of(target)
    if ep is not None:
        others = {e.name for e in entry_points(group=ENTRY_POINT_GROUP)} - {ep.name}
        plugins.load_entry_points(environ={"WERK_DISABLE_PLUGINS": ",".join(sorted(others))})
        loaded = plugins.pm.get_plugin(ep.name)
        if target.plugin is not None and loaded is not None and loaded is not target.plugin:
            pytest.fail(f"the entry point {ENTRY_POINT_GROUP}:{ep.name} names {ep.value}, not the target's plugin")
        loaded_or_fail(plugins, ep.name)
        return plugins, ep.name
    if isinstance(target.plugin, ModuleType):
        tree = source_tree(target.plugin)
        if tree is None:
            pytest.fail(
                f"no {ENTRY_POINT_GROUP} entry point names {target.plugin.__name__}: declare one and install it"
            )
        if name is not None and name != tree.name:
            pytest.fail(f"the plugin's entry point is {ENTRY_POINT_GROUP}:{tree.name}, not {name}")
        reason = incompatibility(cast(Distribution, tree))
        if reason is not None:
            pytest.fail(f"plugin {tree.name} did not load as a user's install would: {reason}")
        plugins.register(target.plugin, tree.name)
        return plugins, tree.name
    if target.plugin is None or name is None:
        pytest.fail(
            f"no installed plugin has the entry point {ENTRY_POINT_GROUP}:{name}: install it (pip install -e .)"
        )
    plugins.register(target.plugin, name)  # a test's own plugin object, never installed
    return plugins, name


def remote_profile(home: Path, target: ConformanceTarget, manifest: ModelManifest, plugin: str) -> Path:
    """A deployment profile with the file-less manifest as its one remote instance."""
    if target.endpoint is None:
        pytest.fail("a manifest without files is a remote model: give the target its endpoint")
    lines = [
        "[[instance]]",
        'id = "conformance"',
        f"model = {json.dumps(manifest.name)}",
        f"backend = {json.dumps(manifest.backend or plugin)}",
        f"endpoint = {json.dumps(target.endpoint)}",
        "preload = true",
    ]
    if target.api_key_env is not None:
        lines.append(f"api_key_env = {json.dumps(target.api_key_env)}")
    profile = home / "conformance-profile.toml"
    profile.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return profile


@contextmanager
def environ_set(values: dict[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def loaded_or_fail(plugins: PluginHost, name: str) -> None:
    record = next((r for r in plugins.records if r.name == name), None)
    if record is None or record.status != "loaded":
        why = record.error if record is not None else "it was not found"
        pytest.fail(f"plugin {name} did not load as a user's install would: {why}")


def stream_answer(host: ConformanceHost, path: str, body: JsonValue) -> tuple[int, str, list[str]]:
    """POST ``body`` and read the whole answer: its status, content type, and the ``data:``
    payloads of an event stream (the raw body, as one item, of any other answer)."""
    conn = http.client.HTTPConnection(host.api.host, host.api.port, timeout=host.api.timeout)
    headers = {"Authorization": f"Bearer {host.key}", "Content-Type": "application/json"}
    try:
        conn.request("POST", path, body=json.dumps(body).encode(), headers=headers)
        response = conn.getresponse()
        raw = response.read().decode("utf-8", errors="replace")
        kind = response.getheader("Content-Type") or ""
    finally:
        conn.close()
    if not kind.startswith("text/event-stream"):
        return response.status, kind, [raw]
    events = [line[len("data:") :].strip() for line in raw.splitlines() if line.startswith("data:")]
    return response.status, kind, events


@contextmanager
def served_target(target: ConformanceTarget, home: Path) -> Iterator[ConformanceHost]:
    """A host around the target's plugin alone (:func:`load_target`), on ``home``, with one API
    key and the target's model (or its remote instance), served on an ephemeral port: what
    every conformance suite of the kit checks (werk_host.testing.conformance,
    werk_host.testing.media_conformance)."""
    home.mkdir(parents=True, exist_ok=True)
    if isinstance(target.model, ModelManifest):
        manifest = target.model
    else:
        manifest = checkpoint_manifest(target.model, target.model_name)
    plugins, name = load_target(target)
    key = f"sk-werk-conformance-{secrets.token_hex(8)}"
    config = HostConfig(home=home, api_keys=(key,), backend_options=dict(target.backend_options))
    if manifest.files:
        ModelRegistry(home).add(manifest)
        config = replace(config, model=manifest.name)
    else:
        config = replace(config, profile=remote_profile(home, target, manifest, name))
    with environ_set(target.environ):
        try:
            host = build_host(config, plugins=plugins)
        finally:
            loaded_or_fail(plugins, name)
        with running(host) as url:
            yield ConformanceHost(
                host=host,
                api=Api(url, key),
                key=key,
                model_name=manifest.name,
                home=home,
                model_paths=tuple(f.path for f in manifest.files),
                secrets=tuple(v for v in target.environ.values() if v),
            )
