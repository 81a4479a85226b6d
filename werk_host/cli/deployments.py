"""``werk deployments``: the inventory of a running ``werk serve`` as a table (or JSON).

It reads ``GET /werk/v1/deployments`` through the bundled client, with the same connection
options, key handling and exit codes as ``werk runtime`` (docs/deployments.md, "Inventory";
docs/cli.md, "werk deployments"): the server is ``--server``, else ``$WERK_SERVER``, else
``http://127.0.0.1:11434`` (``HOST:PORT`` alone means ``http://``), the key ``$WERK_API_KEY``.
A failure is one line ``werk: <problem> (<fix>)`` on stderr (nothing listening, a key needed
or refused, ...), the JSON error object under ``--json``; the exit code is its class's.

``werk deployments load|unload|pin|unpin ID`` sends ``POST /werk/v1/deployments/{id}/actions``
and ``werk deployments logs ID`` reads ``GET /werk/v1/deployments/{id}/logs``; both need an
operator key in ``$WERK_API_KEY`` (docs/deployments.md, "Operator actions").
"""

from __future__ import annotations

import argparse
from datetime import datetime
from typing import Any

from werk_host.cli.arguments import KEY_ENV
from werk_host.cli.connection import SERVER_ENV, client_for, connection_options, emit_error, exit_code_for
from werk_host.cli.output import add_json_flag
from werk_host.client import WerkClientError
from werk_host.protocol import DeploymentActionRequest, Deployments
from werk_host.protocol.deployments import DeploymentLogs, InstanceInventory

COLUMNS = ("ID", "BACKEND", "MODEL", "STATE", "SINCE", "PID", "IN-FLIGHT", "SLOTS", "KEEP-ALIVE", "ALIASES")
#: The operator actions ``werk deployments ACTION ID`` sends.
ACTIONS = ("load", "unload", "pin", "unpin")


def _keep_alive(seconds: float | None) -> str:
    if seconds is None:
        return "forever"
    return f"{seconds:g}s"


def _since(unix_ms: int | None) -> str:
    """When the state began, as local ``HH:MM:SS``."""
    if unix_ms is None:
        return "-"
    return datetime.fromtimestamp(unix_ms / 1000).strftime("%H:%M:%S")


def render_table(doc: Deployments) -> str:
    """One row per instance (the default one marked ``*``), then any failure reasons."""
    slots = {s.instance: s for s in doc.slots}
    rows = [COLUMNS]
    for inv in doc.inventory:
        slot = slots.get(inv.id)
        total = "-" if slot is None or slot.total is None else f"{slot.busy}/{slot.total}"
        rows.append(
            (
                inv.id + ("*" if inv.default else ""),
                inv.backend,
                inv.model,
                inv.state.value + (" (pinned)" if inv.pinned else ""),
                _since(inv.state_since_unix_ms),
                "-" if inv.pid is None else str(inv.pid),
                str(inv.in_flight),
                total,
                _keep_alive(inv.keep_alive_seconds),
                ",".join(inv.aliases) or "-",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]
    lines += [f"{inv.id}: {inv.error}" for inv in doc.inventory if inv.error]
    lines += [f"{inv.id}: {text}" for inv in doc.inventory if (text := _file_cache(inv))]
    return "\n".join(lines)


def _file_cache(inv: InstanceInventory) -> str | None:
    """The last unload's page-cache release (docs/operations.md, "Model file cache")."""
    cache = inv.file_cache
    if cache is None or cache.last_release is None:
        return None
    if not cache.release:
        return f"file cache kept at the last unload (model_cache_release {cache.mode})"
    done = [f for f in cache.last_release if f.released]
    freed = sum(f.bytes for f in done)
    text = f"file cache released for {len(done)} of {len(cache.last_release)} file(s), {freed} bytes"
    kept = sorted({f"{f.file}: {f.why}" for f in cache.last_release if not f.released})
    return text + (f" (kept {'; '.join(kept)})" if kept else "")


def _log_text(logs: DeploymentLogs) -> str:
    """Werk's lifecycle events, then (under a rule) the backend's own log tail when it has one."""
    text = "\n".join(logs.lines)
    if logs.backend_lines is not None:
        text += "\n--- backend log ---\n" + "\n".join(logs.backend_lines)
    return text


def cmd_deployments(args: argparse.Namespace) -> int:
    try:
        client = client_for(args)
        action = getattr(args, "action", None)
        if action == "logs":
            logs = client.deployment_logs(args.instance, args.lines)
            text = logs.model_dump_json(indent=2) if args.json else _log_text(logs)
        elif action is not None:
            result = client.deployment_action(args.instance, DeploymentActionRequest(action=action))
            inv = result.instance
            text = result.model_dump_json(indent=2) if args.json else f"{inv.id}: {inv.state.value}"
            text += "" if args.json or inv.error is None else f" ({inv.error})"
        else:
            doc = client.deployments()
            text = doc.model_dump_json(indent=2) if args.json else render_table(doc)
    except WerkClientError as err:
        emit_error(err, args)
        return exit_code_for(err)
    print(text, flush=True)
    return 0


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "deployments",
        help="the instances of a running werk serve, as a table",
        description="The instances of a running werk serve, one row each (the default one marked *). "
        f"The server is --server URL or ${SERVER_ENV}; a keyed server needs its key in ${KEY_ENV}.",
        epilog="exit status: 0 listed; 3 nothing listens at the URL, 4 no answer in time, 12 a bad URL, "
        "22 a key is needed or was refused, 23 the key may not do this (all codes: docs/cli.md)",
        parents=[connection_options()],
    )
    add_json_flag(parser)
    parser.set_defaults(handler=cmd_deployments)
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=False)
    for name, summary in (
        ("load", "start an instance now (unloading others as residency requires)"),
        ("unload", "stop an instance that has no request in flight"),
        ("pin", "never unload an instance to make room"),
        ("unpin", "let an instance be unloaded to make room again"),
        ("logs", "an instance's lifecycle log tail, then its backend's own"),
    ):
        sub = actions.add_parser(
            name,
            help=summary + " (operator key)",
            description=summary.capitalize() + f"; needs an operator key in ${KEY_ENV}.",
            parents=[connection_options()],
        )
        sub.add_argument("instance", metavar="ID", help="the instance id (werk deployments lists them)")
        if name == "logs":
            sub.add_argument("--lines", type=int, default=100, choices=range(1, 201), metavar="N", help="1-200")
        add_json_flag(sub)
        sub.set_defaults(handler=cmd_deployments)
