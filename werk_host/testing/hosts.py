"""Build hosts around a plugin and serve them on a real waitress server on an ephemeral port.

A plugin's own suite starts the same host ``werk serve`` runs, around its plugin object (or
module), with keys and a model of its choosing::

    from werk_host.testing.hosts import serving

    with serving(tmp_path / "home", plugin=my_plugin, model=gguf_path, api_keys=("sk-test",)) as live:
        status, body = live.api.get("/werk/v1/capabilities")

Only the plugins passed in are registered (installed ``werk`` entry points are not loaded
unless ``load_entry_points=True``). Without ``plugin`` the host is bare (no backend). Without
``model``, the reference plugin gets a placeholder model (:func:`install_model`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pydantic import JsonValue

from werk_host.config import HostConfig
from werk_host.memory import MemoryManager
from werk_host.models import ModelManifest, ModelRegistry
from werk_host.pluginhost import PluginHost
from werk_host.protocol.telemetry import ChatCounters
from werk_host.server import Host, build_host, make_server
from werk_host.testing.api import Api
from werk_host.testing.reference import BACKEND_ID, PLUGIN_NAME, MemoryBackendPlugin

#: The model name the helpers install by default.
MODEL = "tiny"
#: Manifest params of the placeholder model.
DEFAULT_PARAMS: Mapping[str, JsonValue] = {"max_output_tokens": 32}


def install_model(
    home: Path,
    name: str = MODEL,
    *,
    path: Path | None = None,
    backend: str | None = BACKEND_ID,
    params: Mapping[str, JsonValue] | None = None,
) -> ModelManifest:
    """Register a model manifest named ``name`` in ``home``'s model registry and return it.

    ``path`` is the model file; without one a small placeholder weights file is written next
    to ``home`` (``home.parent/<name>.bin``), which only the reference backend can "serve".
    ``backend`` pins the manifest to a backend id or plugin name (``None``: the first plugin
    whose factory accepts the file). ``params`` defaults to :data:`DEFAULT_PARAMS`."""
    if path is None:
        path = home.parent / f"{name}.bin"
        path.write_bytes(b"not really weights " + name.encode())
    manifest = ModelManifest.from_paths(
        name, [path], backend=backend, params=dict(params if params is not None else DEFAULT_PARAMS)
    )
    ModelRegistry(home).add(manifest)
    return manifest


def plugin_name_of(plugin: object) -> str:
    """The name to register ``plugin`` under: its ``PLUGIN_NAME`` or ``name`` string attribute.

    It becomes the owner of the adapters its factories create (the entry-point name a user's
    install would give it); pass ``plugin_name=`` when the plugin has neither."""
    for attr in ("PLUGIN_NAME", "name"):
        value = getattr(plugin, attr, None)
        if isinstance(value, str) and value:
            return value
    raise TypeError(f"cannot tell the plugin name of {plugin!r}: pass plugin_name=")


def make_host(
    home: Path,
    *,
    api_keys: tuple[str, ...] = (),
    plugin: object | None = None,
    plugin_name: str | None = None,
    with_model: bool = True,
    model: ModelManifest | Path | str | None = None,
    backend_options: Mapping[str, object] | None = None,
    extra_plugins: Mapping[str, object] | None = None,
    load_entry_points: bool = False,
    memory: MemoryManager | None = None,
    **config: Any,
) -> Host:
    """Build (not serve) a host on ``home`` around ``plugin``; the caller must ``close()`` it.

    * ``plugin``: a plugin object or module, registered as ``plugin_name`` (default
      :func:`plugin_name_of`); ``extra_plugins`` registers more (name → plugin), e.g. wrappers.
    * ``model``: a :class:`ModelManifest` (registered as given), a model file ``Path``
      (registered as :data:`MODEL` with no pinned backend), or the name of a model already in
      ``home``'s registry. Without one, and with ``with_model`` and a ``plugin``, the reference
      placeholder model is installed (:func:`install_model`).
    * ``backend_options``: the plugin's own settings, stored as
      ``HostConfig.backend_options[plugin_name]``.
    * ``api_keys``: the accepted bearer keys (none: authentication off).
    * ``memory``: the host's memory telemetry (default: this machine's;
      :func:`werk_host.testing.memory.snapshot_memory` gives figures a test sets).
    * ``config``: any other :class:`HostConfig` field (``limits``, ``persistence``, …).
    """
    home.mkdir(parents=True, exist_ok=True)
    plugins = PluginHost()
    if load_entry_points:
        plugins.load_entry_points()
    name: str | None = None
    if plugin is not None:
        name = plugin_name or plugin_name_of(plugin)
        plugins.register(plugin, name)
    for extra_name, extra in (extra_plugins or {}).items():
        plugins.register(extra, extra_name)
    model_ref: str | None = None
    if isinstance(model, ModelManifest):
        ModelRegistry(home).add(model)
        model_ref = model.name
    elif isinstance(model, os.PathLike):
        model_ref = install_model(home, MODEL, path=Path(model), backend=None, params={}).name
    elif isinstance(model, str):
        model_ref = model
    elif with_model and plugin is not None:
        model_ref = install_model(home).name
    cfg = HostConfig(home=home, api_keys=api_keys, model=model_ref)
    if backend_options is not None:
        if name is None:
            raise TypeError("backend_options needs a plugin")
        cfg = replace(cfg, backend_options={name: dict(backend_options)})
    if config:
        cfg = replace(cfg, **config)
    return build_host(cfg, plugins=plugins, memory=memory)


def backend_host(
    home: Path, *, adapter_kwargs: Mapping[str, Any] | None = None, **kwargs: Any
) -> tuple[Host, MemoryBackendPlugin]:
    """A host around a fresh reference plugin (``adapter_kwargs`` go to
    :class:`~werk_host.testing.reference.MemoryBackendPlugin`), plus that plugin."""
    plugin = MemoryBackendPlugin(**dict(adapter_kwargs or {}))
    return make_host(home, plugin=plugin, plugin_name=PLUGIN_NAME, **kwargs), plugin


@contextmanager
def running(host: Host) -> Iterator[str]:
    """Serve ``host.app`` on 127.0.0.1:<ephemeral>; yields the base URL; always stops the server
    and closes ``host`` (its backend processes) on the way out."""
    server = make_server(host.app, "127.0.0.1", 0, host.config.limits)
    port = server.getsockname()[1]
    stopping = threading.Event()

    def run() -> None:
        try:
            server.run()
        except OSError:
            if not stopping.is_set():  # closing the socket under select() is the normal way out
                raise

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stopping.set()
        server.task_dispatcher.shutdown(cancel_pending=True, timeout=5)
        server.close()
        thread.join(timeout=5)
        host.close()


def settled(host: Host, timeout: float = 30.0) -> ChatCounters:
    """``host``'s chat counters once every answer is closed (at most ``timeout`` seconds) and the
    prompt-cache commits they started are written. A client holds an answer whole before the
    server has closed it, and an answer is counted when it closes, so counters read right after
    a response may still miss that request."""
    deadline = time.monotonic() + timeout
    while host.service.chat_stats.read().requests_active and time.monotonic() < deadline:
        time.sleep(0.01)
    host.service.prompt_caches.wait()
    return host.service.chat_stats.read()


@dataclass(frozen=True)
class LiveHost:
    """A served host: ``url`` (``http://127.0.0.1:<port>``), the :class:`Host` and an
    :class:`~werk_host.testing.api.Api` holding the first API key (``None`` without keys)."""

    url: str
    host: Host
    api: Api


@contextmanager
def serving(home: Path, **kwargs: Any) -> Iterator[LiveHost]:
    """:func:`make_host` (same keyword arguments) served by :func:`running`; always stopped and closed."""
    host = make_host(home, **kwargs)
    keys = kwargs.get("api_keys") or ()
    with running(host) as url:
        yield LiveHost(url, host, Api(url, keys[0] if keys else None))


@dataclass(frozen=True)
class ServeProcess:
    """A ``werk serve`` process: its ``url`` and the ``log`` its stderr goes to."""

    url: str
    log: Path


@contextmanager
def serve_process(
    home: Path,
    *args: str,
    keys: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    drop: Sequence[str] = (),
) -> Iterator[ServeProcess]:
    """``werk serve --port 0 ARGS`` as its own process (the real command line, as a user runs
    it) with ``WERK_HOME=home``, ``keys`` in ``WERK_API_KEYS``, ``env`` over this process's
    environment less the names in ``drop``; its stderr goes to ``home``'s sibling ``serve.log``.
    Stopped with SIGTERM when the block ends (killed after 30 s)."""
    environ = {**os.environ, "WERK_HOME": str(home), **(env or {})}
    if keys:
        environ["WERK_API_KEYS"] = ",".join(keys)
    for name in drop:
        environ.pop(name, None)
    log = home.with_name("serve.log")
    with open(log, "wb") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "werk_host", "serve", "--port", "0", *args],
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=environ,
            text=True,
        )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"werk serve did not start: {log.read_text(errors='replace')[-4000:]}")
        yield ServeProcess(f"http://127.0.0.1:{json.loads(line)['port']}", log)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


__all__ = [
    "DEFAULT_PARAMS",
    "MODEL",
    "LiveHost",
    "ServeProcess",
    "backend_host",
    "install_model",
    "make_host",
    "plugin_name_of",
    "running",
    "serve_process",
    "serving",
]
