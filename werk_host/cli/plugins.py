"""``werk plugins``: the plugin inventory (docs/cli.md, "werk plugins"; docs/plugin-kit.md).

Text by default: a table (NAME, DISTRIBUTION, VERSION, STATUS, BACKENDS), then each failed
plugin's error with its fix, each loaded plugin's flagged problems, and a ``not installed``
hint naming the first-party plugins (:data:`FIRST_PARTY`) that are absent with their ``pip
install`` line. ``--json`` prints the inventory records unchanged (name, distribution, version,
status, hooks, error, problems). Exit code 0. Cheap: plugins are imported and their factories
offered (which starts nothing); engines are checked by ``werk doctor``, not here.
"""

from __future__ import annotations

import argparse
from typing import Any

from packaging.utils import canonicalize_name

from werk_host import __version__
from werk_host.cli.output import add_json_flag, emit, table
from werk_host.config import HostConfig
from werk_host.paths import werk_home
from werk_host.pluginhost import PluginHost, PluginRecord

#: The first-party plugins: entry-point name -> distribution (docs/plugin-kit.md).
FIRST_PARTY = {
    "llamacpp": "werk-llamacpp",
    "vllm": "werk-vllm",
    "omlx": "werk-omlx",
    "candle": "werk-candle-bridge",
}


def load_plugins(config: HostConfig) -> tuple[PluginHost, dict[str, list[str]]]:
    """Every installed plugin loaded (tolerantly) and the backend ids each one offers."""
    host = PluginHost()
    host.load_entry_points()
    backends: dict[str, list[str]] = {}
    for factory in host.adapter_factories(config):  # cheap by contract: starts nothing
        backends.setdefault(factory.owner, []).append(factory.backend)
    host.add_cli_commands(argparse.ArgumentParser(prog="werk").add_subparsers())  # flags a raising werk_cli_commands
    return host, backends


def plugin_fix(record: PluginRecord) -> str | None:
    """What to do about a plugin that did not load (``None`` for a loaded or disabled one)."""
    if record.status != "failed":
        return None
    dist = record.distribution or record.name
    disable = f"WERK_DISABLE_PLUGINS={record.name}"
    error = record.error or ""
    if "declares no werk-host requirement" in error:
        return f"ask its authors to declare werk-host>={__version__.rsplit('.', 1)[0]}, or disable it: {disable}"
    if "says plugin_name" in error:  # the host derives the owner (docs/plugin-hooks.md, "Ownership")
        return f"ask its authors to drop plugin_name or match the entry point's name, or disable it: {disable}"
    if error.startswith("requires werk-host"):
        return f"install a {dist} built for werk-host {__version__} (pip install -U {dist}), or disable it: {disable}"
    return f"reinstall it (pip install --force-reinstall {dist}), or disable it: {disable}"


def missing_first_party(host: PluginHost) -> dict[str, str]:
    """First-party plugins that are not installed (neither an entry point nor a distribution)."""
    names = {r.name for r in host.records}
    dists = {canonicalize_name(r.distribution) for r in host.records if r.distribution}
    return {n: d for n, d in FIRST_PARTY.items() if n not in names and canonicalize_name(d) not in dists}


def render_inventory(host: PluginHost, backends: dict[str, list[str]]) -> str:
    records = sorted(host.records, key=lambda r: r.name)
    lines: list[str] = []
    if records:
        rows = [
            [r.name, r.distribution, r.version, r.status, ", ".join(backends.get(r.name, [])) or None] for r in records
        ]
        lines.append(table(["NAME", "DISTRIBUTION", "VERSION", "STATUS", "BACKENDS"], rows))
    else:
        lines.append("no plugins installed: werk serve answers the protocol with no backend")
    for record in records:
        if record.status == "failed":
            lines += ["", f"{record.name} failed: {record.error}", f"  fix: {plugin_fix(record)}"]
        for problem in record.problems:
            lines += ["", f"{record.name} {problem}", "  fix: report it to the plugin's authors"]
    missing = missing_first_party(host)
    if missing:
        lines += ["", f"not installed: {', '.join(missing)} (pip install {' '.join(missing.values())})"]
    lines += ["", "werk doctor checks each plugin's engine (llama-server, vLLM, MLX, mistralrs)"]
    return "\n".join(lines)


def cmd_plugins(args: argparse.Namespace) -> int:
    """The plugin inventory; offering the factories flags declared capability ids that are unknown."""
    host, backends = load_plugins(HostConfig(home=werk_home(None)))
    emit(args, host.inventory(), render_inventory(host, backends))
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser(
        "plugins",
        help="list installed plugins, what failed and how to fix it",
        description="List the installed plugins (table), failed ones with their fix, and first-party "
        "plugins that are not installed. Exit code 0.",
    )
    add_json_flag(p)
    p.set_defaults(handler=cmd_plugins)
