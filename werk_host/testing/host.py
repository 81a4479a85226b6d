"""The host's own objects a plugin's tests build and inspect (docs/plugin-kit.md, "Testing").

A plugin's tests import the host through :mod:`werk_host.plugin` and :mod:`werk_host.testing`
only; this module is the part of the latter that hands out the host itself: building a host
around installed plugins (:func:`build_host`), its plugin inventory (:class:`PluginHost`), the
model registry, profile errors, the ``werk`` command line (:func:`werk_main`), and the child
records and cache locks a plugin's crash tests plant.
"""

from __future__ import annotations

from werk_host.backend_caches import hold_owner_lock
from werk_host.backends.records import ChildRecord, write_record
from werk_host.cli import main as werk_main
from werk_host.cli.cache import cmd_list as cache_list_command
from werk_host.deployments.profile import ProfileError
from werk_host.models import ModelRegistry
from werk_host.pluginhost import PluginHost
from werk_host.server import Host, build_host

__all__ = [
    "ChildRecord",
    "Host",
    "ModelRegistry",
    "PluginHost",
    "ProfileError",
    "build_host",
    "cache_list_command",
    "hold_owner_lock",
    "werk_main",
    "write_record",
]
