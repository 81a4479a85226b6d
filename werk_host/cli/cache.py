"""``werk cache list`` and ``werk cache purge <ID> | --all [--dry-run]``.

Runtime states live in ``WERK_HOME/runtime-state/v1`` (through :class:`werk_host.store.StateStore`);
backend-owned caches (e.g. llama.cpp's per-process slot directories) in ``WERK_HOME/backends``
(:mod:`werk_host.backend_caches`: an entry whose owner still holds its lock is active and kept);
chat sessions (archive and native snapshot listed apart) in ``WERK_HOME/chat-sessions``
(:mod:`werk_host.chat.inventory`: ``--all`` keeps archives unless ``--include-chat-sessions``).
A purge of runtime states takes the same process mutex and ``.lock`` advisory lock as a running
server, and the other parts honour their owner locks, so a purge is safe while one runs.
``list`` is strictly read-only. Purge skips pinned states and active ones (a payload currently
open for use by any process). Output is JSON on stdout; errors are JSON on stderr with a
non-zero exit status.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, TextIO

from werk_host import backend_caches
from werk_host.chat import inventory as chat_sessions
from werk_host.errors import WerkError, invalid, not_found
from werk_host.paths import werk_home
from werk_host.store import StateStore, runtime_state_root


def _store(args: argparse.Namespace) -> StateStore:
    return StateStore(runtime_state_root(werk_home(getattr(args, "home", None))))


def _emit(value: Any, out: TextIO) -> None:
    out.write(json.dumps(value, indent=2, sort_keys=True) + "\n")


def _fail(err: WerkError, err_out: TextIO) -> int:
    err_out.write(json.dumps({"error": {"code": err.code.value, "message": err.public_message()}}) + "\n")
    return 2 if err.code.value == "invalid_request" else 1


def cmd_list(args: argparse.Namespace, *, out: TextIO | None = None) -> int:
    """Print the runtime-state inventory (read-only: creates and changes nothing)."""
    out = out or sys.stdout
    entries = _store(args).inventory()
    states = [e for e in entries if e.kind == "state"]
    home = werk_home(getattr(args, "home", None))
    backends = backend_caches.inventory(home)
    chats = chat_sessions.inventory(home)
    _emit(
        {
            "runtime_states": [e.to_json() for e in entries],
            "backend_caches": [b.to_json() for b in backends],
            "chat_sessions": [c.to_json() for c in chats],
            "totals": {
                "entries": len(entries),
                "states": len(states),
                "pinned": sum(1 for e in states if e.pinned),
                "active": sum(1 for e in entries if e.active),
                "expired": sum(1 for e in states if e.expired),
                "invalid": sum(1 for e in states if e.invalid),
                "quarantined": sum(1 for e in entries if e.kind == "quarantine"),
                "disk_bytes": sum(e.disk_bytes or 0 for e in entries)
                + sum(b.bytes for b in backends)
                + sum(c.disk_bytes for c in chats),
                "backend_caches": len(backends),
                "backend_caches_active": sum(1 for b in backends if b.active),
                "chat_sessions": len(chats),
                "chat_sessions_active": sum(1 for c in chats if c.active),
            },
        },
        out,
    )
    return 0


def cmd_purge(args: argparse.Namespace, *, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Remove one entry or everything removable; pinned and active entries are skipped."""
    out = out or sys.stdout
    err = err or sys.stderr
    cache_id: str | None = args.id
    purge_all = bool(args.purge_all)
    try:
        if (cache_id is None) == (not purge_all):
            raise invalid("give exactly one of <ID> or --all")
        home = werk_home(getattr(args, "home", None))
        backend_ids = [cache_id] if cache_id is not None else None
        if cache_id is not None and chat_sessions.owns(cache_id):
            chats = chat_sessions.purge(home, cache_id=cache_id, dry_run=bool(args.dry_run))
            if not chats.removed:
                raise not_found("no inactive chat-session entry with that id")
            _emit({**chats.to_json(), "dry_run": bool(args.dry_run)}, out)
            return 0
        if cache_id is not None and cache_id.startswith("backend:"):
            removed = backend_caches.purge(home, ids=backend_ids, dry_run=bool(args.dry_run))
            if not removed:
                raise not_found("no inactive backend cache entry with that id")
            _emit({"backend_caches": [b.to_json() for b in removed], "dry_run": bool(args.dry_run)}, out)
            return 0
        outcome = _store(args).purge(
            ids=[cache_id] if cache_id is not None else None,
            everything=purge_all,
            dry_run=bool(args.dry_run),
        )
        if cache_id is not None and outcome.matched == 0:
            raise not_found("no runtime-state cache entry with that id")
        removed = backend_caches.purge(home, ids=None, dry_run=bool(args.dry_run)) if purge_all else []
        chat_part: dict[str, object] = {}
        if purge_all:  # conversation archives stay unless --include-chat-sessions
            include = bool(getattr(args, "include_chat_sessions", False))
            chats = chat_sessions.purge(home, cache_id=None, include_sessions=include, dry_run=bool(args.dry_run))
            chat_part = chats.to_json()
    except WerkError as exc:
        return _fail(exc, err)
    _emit({**outcome.to_json(), "backend_caches": [b.to_json() for b in removed], **chat_part}, out)
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``cache`` command group (``list``, ``purge``) to the ``werk`` parser."""
    cache = subparsers.add_parser("cache", help="inspect and clean local runtime-state storage")
    sub = cache.add_subparsers(dest="cache_command", required=True)
    lst = sub.add_parser("list", help="inventory runtime states with sizes, pinned and active marks")
    lst.add_argument("--home", help="WERK_HOME (default: $WERK_HOME or ~/.werk)")
    lst.set_defaults(handler=cmd_list)
    purge = sub.add_parser("purge", help="remove a runtime state (or --all), skipping pinned/active")
    purge.add_argument("id", nargs="?", metavar="ID", help="state id or quarantine entry from `cache list`")
    purge.add_argument("--all", dest="purge_all", action="store_true", help="everything removable")
    purge.add_argument("--dry-run", action="store_true", help="preview only; changes nothing")
    purge.add_argument(
        "--include-chat-sessions",
        action="store_true",
        help="with --all: remove inactive chat sessions' conversation archives too (kept otherwise)",
    )
    purge.add_argument("--home", help="WERK_HOME (default: $WERK_HOME or ~/.werk)")
    purge.set_defaults(handler=cmd_purge)
