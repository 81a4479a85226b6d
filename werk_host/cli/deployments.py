"""``werk deployments``: the inventory of a running ``werk serve`` as a table (or JSON).

It reads ``GET /werk/v1/deployments`` through the bundled client, with the same connection
options, key handling and exit codes as ``werk runtime`` (docs/deployments.md, "Inventory";
docs/cli.md, "werk deployments"): the server is ``--server``, else ``$WERK_SERVER``, else
``http://127.0.0.1:11434`` (``HOST:PORT`` alone means ``http://``), the key ``$WERK_API_KEY``.
A failure is one line ``werk: <problem> (<fix>)`` on stderr (nothing listening, a key needed
or refused, ...), the JSON error object under ``--json``; the exit code is its class's.
"""

from __future__ import annotations

import argparse
from typing import Any

from werk_host.cli.connection import KEY_ENV, SERVER_ENV, client_for, connection_options, emit_error, exit_code_for
from werk_host.cli.output import add_json_flag
from werk_host.client import WerkClientError
from werk_host.protocol import Deployments

COLUMNS = ("ID", "BACKEND", "MODEL", "STATE", "PID", "IN-FLIGHT", "SLOTS", "KEEP-ALIVE", "ALIASES")


def _keep_alive(seconds: float | None) -> str:
    if seconds is None:
        return "forever"
    return f"{seconds:g}s"


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
                inv.state.value,
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
    return "\n".join(lines)


def cmd_deployments(args: argparse.Namespace) -> int:
    try:
        doc = client_for(args).deployments()
    except WerkClientError as err:
        emit_error(err, args)
        return exit_code_for(err)
    print(doc.model_dump_json(indent=2) if args.json else render_table(doc), flush=True)
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
