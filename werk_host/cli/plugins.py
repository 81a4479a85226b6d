"""``werk plugins``: the plugin inventory (docs/plugin-kit.md)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from werk_host.config import HostConfig
from werk_host.paths import werk_home


def cmd_plugins(args: argparse.Namespace) -> int:
    """The plugin inventory; offering the factories flags declared capability ids that are unknown."""
    from werk_host.plugins import PluginHost

    host = PluginHost()
    host.load_entry_points()
    host.adapter_factories(HostConfig(home=werk_home(None)))  # cheap by contract: starts nothing
    print(json.dumps(host.inventory(), indent=2, sort_keys=True))
    return 0


def register(sub: Any) -> None:
    sub.add_parser("plugins", help="list discovered plugins").set_defaults(handler=cmd_plugins)
