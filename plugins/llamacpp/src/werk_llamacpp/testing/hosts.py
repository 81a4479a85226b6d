"""A host serving llama.cpp instances from a deployment profile, for tests and benchmarks.

:func:`profile_host` registers each model file under its name (backend ``llama.cpp``) in
``home``'s registry, writes the profile text beside ``home`` and builds (does not serve) a
host with only this plugin and the given ``llama-server``. Serve it with
:func:`werk_host.testing.hosts.running`; closing it is the caller's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from werk_host.plugin import HostConfig, ModelManifest
from werk_host.testing.host import Host, ModelRegistry, PluginHost, build_host
from werk_llamacpp import plugin as llama_plugin

__all__ = ["profile_host"]


def profile_host(
    home: Path,
    models: Mapping[str, Path],
    profile: str,
    llama_server: Path,
    *,
    api_keys: Sequence[str] = (),
    operator_api_keys: Sequence[str] = (),
) -> Host:
    """The host of ``profile`` (TOML text) over ``models`` (name → GGUF) on ``home``."""
    home.mkdir(parents=True, exist_ok=True)
    registry = ModelRegistry(home)
    for name, path in models.items():
        registry.add(ModelManifest.from_paths(name, [path], backend="llama.cpp"))
    profile_path = home.with_name(home.name + "-deployments.toml")
    profile_path.write_text(profile)
    plugins = PluginHost()
    plugins.register(llama_plugin, "llamacpp")
    config = HostConfig(
        home=home,
        api_keys=tuple(api_keys),
        operator_api_keys=tuple(operator_api_keys),
        profile=profile_path,
        backend_options={"llamacpp": {"llama_server": str(llama_server)}},
    )
    return build_host(config, plugins=plugins)
