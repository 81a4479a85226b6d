"""Build hosts for tests and run them on a real waitress server on an ephemeral port."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from tests.support.testadapter import MemoryBackendPlugin
from werk_host.config import HostConfig
from werk_host.models import ModelManifest, ModelRegistry
from werk_host.plugins import PluginHost
from werk_host.server import Host, build_host, make_server

MODEL = "tiny"


def install_model(home: Path, name: str = MODEL) -> ModelManifest:
    weights = home.parent / f"{name}.bin"
    weights.write_bytes(b"not really weights " + name.encode())
    manifest = ModelManifest.from_paths(name, [weights], backend="test-backend", params={"max_output_tokens": 32})
    ModelRegistry(home).add(manifest)
    return manifest


def make_host(
    home: Path,
    *,
    api_keys: tuple[str, ...] = (),
    plugin: Any | None = None,
    with_model: bool = True,
    **config: Any,
) -> Host:
    home.mkdir(parents=True, exist_ok=True)
    plugins = PluginHost()
    if plugin is not None:
        plugins.register(plugin, getattr(plugin, "name", "testbackend"))
    model = None
    if with_model and plugin is not None:
        model = install_model(home).name
    cfg = HostConfig(home=home, api_keys=api_keys, model=model)
    if config:
        cfg = replace(cfg, **config)
    return build_host(cfg, plugins=plugins)


def backend_host(home: Path, **kwargs: Any) -> tuple[Host, MemoryBackendPlugin]:
    plugin = MemoryBackendPlugin(**kwargs.pop("adapter_kwargs", {}))
    return make_host(home, plugin=plugin, **kwargs), plugin


@contextmanager
def running(host: Host) -> Iterator[str]:
    """Serve ``host.app`` on 127.0.0.1:<ephemeral>; yields the base URL; always stops."""
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
