"""``werk cache list`` and ``werk cache purge <ID> | --all [--dry-run]``.

Runtime states live in ``WERK_HOME/runtime-state/v1`` (through :class:`werk_host.store.StateStore`);
backend-owned caches (e.g. llama.cpp's per-process slot directories) in ``WERK_HOME/backends``
(:mod:`werk_host.backend_caches`: an entry whose owner still holds its lock is active and kept);
chat sessions (archive and native snapshot listed apart) in ``WERK_HOME/chat-sessions``
(:mod:`werk_host.chat.inventory`: ``--all`` keeps archives unless ``--include-chat-sessions``);
automatic prompt caches per instance and key in ``WERK_HOME/prompt-cache`` (ids
``prompt:<instance>/<entry>``; docs/prompt-cache.md), under the runtime-state store's rules;
media job records in ``WERK_HOME/jobs`` are listed (kind ``job``; a queued or running one
``active``) but never purged here: ``werk jobs purge`` removes them (docs/media.md, "Jobs").
A purge of runtime states takes the same process mutex and ``.lock`` advisory lock as a running
server, and the other parts honour their owner locks, so a purge is safe while one runs.
``list`` is strictly read-only. Purge skips pinned states and active ones (a payload currently
open for use by any process).

Output (docs/cli.md, "werk cache"): ``list`` prints a table (ID, OWNER, KIND, MODEL, SIZE,
MARKS, TIER) and a totals line; ``purge`` one summary line of what went (or, with
``--dry-run``, would go) and what was skipped. ``--json`` prints the full JSON documents for
scripts. An error is one line ``werk: <problem> (<fix>)`` on stderr (the JSON error object
under ``--json``); exit status 0 done, 1 no such (inactive) entry, 2 a usage error.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from typing import Any, TextIO

from werk_host import backend_caches
from werk_host.chat import inventory as chat_sessions
from werk_host.cli.output import add_json_flag, human_bytes, table, wants_json
from werk_host.errors import WerkError, invalid, not_found
from werk_host.paths import werk_home
from werk_host.service.promptcache import prompt_cache_store, store_names
from werk_host.store import StateStore, runtime_state_root
from werk_host.store.jobs import JobStore, jobs_root

#: The id prefix of a prompt-cache entry: ``prompt:<instance store>/<entry id>``.
PROMPT_PREFIX = "prompt:"
LIST_COLUMNS = ("ID", "OWNER", "KIND", "MODEL", "SIZE", "MARKS", "TIER")
#: Where every entry ``werk cache`` manages lives (RAM/VRAM tiers belong to a running server:
#: ``werk runtime states list``).
DISK_TIER = "disk"


def _store(args: argparse.Namespace) -> StateStore:
    return StateStore(runtime_state_root(werk_home(getattr(args, "home", None))))


def _emit(args: argparse.Namespace, value: Any, out: TextIO, text: str) -> None:
    out.write((json.dumps(value, indent=2, sort_keys=True) if wants_json(args) else text) + "\n")
    out.flush()


_FIXES = {
    "invalid_request": "werk cache purge ID, or werk cache purge --all [--dry-run]",
    "not_found": "see the ids with: werk cache list",
}


def _fail(args: argparse.Namespace, err: WerkError, err_out: TextIO) -> int:
    if wants_json(args):
        err_out.write(json.dumps({"error": {"code": err.code.value, "message": err.public_message()}}) + "\n")
    else:
        fix = _FIXES.get(err.code.value)
        err_out.write(f"werk: {err.public_message().rstrip('.')}" + (f" ({fix})" if fix else "") + "\n")
    err_out.flush()
    return 2 if err.code.value == "invalid_request" else 1


def _marks(entry: Mapping[str, Any]) -> str:
    names = ("pinned", "active", "expired", "invalid")
    return ",".join(n for n in names if entry.get(n)) or "-"


def _size(value: object) -> str:
    return human_bytes(value) if isinstance(value, int) and not isinstance(value, bool) else "-"


def list_text(doc: Mapping[str, Any]) -> str:
    """``werk cache list`` as a table: runtime states (owner: the principal's prefix), backend
    caches (owner: the plugin), chat sessions (a row per part), then the totals."""
    rows: list[list[object]] = []
    for e in doc["runtime_states"]:
        owner = f"{e['principal_prefix']}…" if e.get("principal_prefix") else None
        size = e.get("disk_bytes") if e.get("disk_bytes") is not None else e.get("bytes")
        rows.append([e["id"], owner, e["kind"], e.get("model_id"), _size(size), _marks(e), DISK_TIER])
    for e in doc.get("prompt_caches", []):
        owner = f"{e['principal_prefix']}…" if e.get("principal_prefix") else None
        kind = "prompt_cache" if e["kind"] == "state" else f"prompt_cache {e['kind']}"
        rows.append([e["id"], owner, kind, e.get("instance"), _size(e.get("bytes")), _marks(e), DISK_TIER])
    for b in doc["backend_caches"]:
        rows.append([b["id"], b["plugin"], "backend_cache", None, _size(b["bytes"]), _marks(b), DISK_TIER])
    for j in doc.get("jobs", []):
        active = "active" if j["status"] in ("queued", "running") else "-"
        kind = f"job {j['kind']} {j['status']}"
        rows.append([j["id"], f"{j['owner_prefix']}…", kind, j.get("model"), _size(j["bytes"]), active, DISK_TIER])
    for c in doc["chat_sessions"]:
        archive, native = c.get("archive"), c.get("native_snapshot")
        marks = _marks(c)
        if archive is not None:
            kind = f"chat archive ({archive.get('messages')} messages)"
            rows.append([archive["id"], "chat", kind, archive.get("model"), _size(archive["bytes"]), marks, DISK_TIER])
        if native is not None:
            kind = "chat snapshot" + ("" if native.get("receipt") else " (no receipt)")
            rows.append([native["id"], "chat", kind, None, _size(native["bytes"]), marks, DISK_TIER])
    t = doc["totals"]
    entries = t["entries"] + t["backend_caches"] + t["chat_sessions"] + len(doc.get("prompt_caches", []))
    entries += len(doc.get("jobs", []))
    totals = (
        f"{entries} entries, {human_bytes(t['disk_bytes'])} on disk: {t['states']} states "
        f"({t['pinned']} pinned, {t['active']} active, {t['expired']} expired, {t['invalid']} invalid), "
        f"{t['quarantined']} quarantined, {t['backend_caches']} backend caches ({t['backend_caches_active']} active), "
        f"{t['chat_sessions']} chat sessions ({t['chat_sessions_active']} active), "
        f"{t.get('prompt_caches', 0)} prompt caches, {t.get('jobs', 0)} jobs"
    )
    if not rows:
        return "nothing cached (" + totals + ")"
    return table(LIST_COLUMNS, rows) + "\n" + totals


def _count(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")


def purge_text(doc: Mapping[str, Any]) -> str:
    """One line: what a purge removed (``would remove`` for a dry run) and what it skipped."""
    parts: list[str] = []
    freed = 0
    if "removed" in doc:  # runtime states, or one prompt cache entry
        n = doc["matched"] - doc["skipped_pinned"] - doc["skipped_active"] if doc["dry_run"] else doc["removed"]
        if n:
            parts.append(_count(n, "prompt cache" if doc.get("prompt_caches") is True else "runtime state"))
        freed += doc.get("bytes") or 0
    if doc.get("prompt_caches_removed"):
        parts.append(_count(doc["prompt_caches_removed"], "prompt cache"))
        freed += doc.get("prompt_caches_bytes") or 0
    caches = doc.get("backend_caches") or []
    if caches:
        parts.append(_count(len(caches), "backend cache"))
        freed += sum(int(b.get("bytes") or 0) for b in caches)
    chats = doc.get("chat_sessions") or []
    sessions = [c for c in chats if c.get("part") == "session"]
    if sessions:
        parts.append(_count(len(sessions), "chat session"))
    if len(chats) - len(sessions):
        parts.append(_count(len(chats) - len(sessions), "chat snapshot"))
    freed += sum(int(c.get("bytes") or 0) for c in chats)
    verb = "would remove" if doc.get("dry_run") else "removed"
    line = f"{verb} {', '.join(parts)} ({human_bytes(freed)})" if parts else f"{verb} nothing"
    skipped = []
    if doc.get("skipped_pinned"):
        skipped.append(f"{doc['skipped_pinned']} pinned")
    active = (doc.get("skipped_active") or 0) + len(doc.get("chat_sessions_skipped_active") or [])
    if active:
        skipped.append(f"{active} active")
    if skipped:
        line += "; skipped " + ", ".join(skipped) + " (unpin, or stop what uses them, then purge again)"
    if doc.get("dry_run"):
        line += "; nothing was changed (run it again without --dry-run)"
    return line


def cmd_list(args: argparse.Namespace, *, out: TextIO | None = None) -> int:
    """Print the runtime-state inventory (read-only: creates and changes nothing)."""
    out = out or sys.stdout
    entries = _store(args).inventory()
    states = [e for e in entries if e.kind == "state"]
    home = werk_home(getattr(args, "home", None))
    backends = backend_caches.inventory(home)
    chats = chat_sessions.inventory(home)
    prompts = [
        {**e.to_json(), "id": f"{PROMPT_PREFIX}{name}/{e.id}", "instance": name}
        for name in store_names(home)
        for e in prompt_cache_store(home, name).inventory()
    ]
    records = JobStore(jobs_root(home)).load()
    jobs: list[dict[str, Any]] = [
        {"id": r.id, "owner_prefix": r.owner[:8], "kind": r.kind, "model": r.model, "status": r.status.value}
        | {"bytes": r.result_bytes}
        for r in records
    ]
    doc: dict[str, Any] = {
        "runtime_states": [e.to_json() for e in entries],
        "prompt_caches": prompts,
        "jobs": jobs,
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
            + sum(c.disk_bytes for c in chats)
            + sum(p["disk_bytes"] or 0 for p in prompts)
            + sum(r.result_bytes for r in records),
            "jobs": len(jobs),
            "prompt_caches": sum(1 for p in prompts if p["kind"] == "state"),
            "backend_caches": len(backends),
            "backend_caches_active": sum(1 for b in backends if b.active),
            "chat_sessions": len(chats),
            "chat_sessions_active": sum(1 for c in chats if c.active),
        },
    }
    _emit(args, doc, out, list_text(doc))
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
            doc = {**chats.to_json(), "dry_run": bool(args.dry_run)}
            _emit(args, doc, out, purge_text(doc))
            return 0
        if cache_id is not None and cache_id.startswith(PROMPT_PREFIX):
            name, _, entry = cache_id[len(PROMPT_PREFIX) :].partition("/")
            found = name in store_names(home) and bool(entry)
            outcome = prompt_cache_store(home, name).purge(ids=[entry], dry_run=bool(args.dry_run)) if found else None
            if outcome is None or outcome.matched == 0:
                raise not_found("no prompt-cache entry with that id")
            doc = {**outcome.to_json(), "prompt_caches": True}
            _emit(args, doc, out, purge_text(doc))
            return 0
        if cache_id is not None and cache_id.startswith("backend:"):
            removed = backend_caches.purge(home, ids=backend_ids, dry_run=bool(args.dry_run))
            if not removed:
                raise not_found("no inactive backend cache entry with that id")
            doc = {"backend_caches": [b.to_json() for b in removed], "dry_run": bool(args.dry_run)}
            _emit(args, doc, out, purge_text(doc))
            return 0
        outcome = _store(args).purge(
            ids=[cache_id] if cache_id is not None else None,
            everything=purge_all,
            dry_run=bool(args.dry_run),
        )
        if cache_id is not None and outcome.matched == 0:
            raise not_found("no runtime-state cache entry with that id")
        removed = backend_caches.purge(home, ids=None, dry_run=bool(args.dry_run)) if purge_all else []
        prompts = [
            prompt_cache_store(home, name).purge(everything=True, dry_run=bool(args.dry_run))
            for name in (store_names(home) if purge_all else [])
        ]
        chat_part: dict[str, object] = {}
        if purge_all:  # conversation archives stay unless --include-chat-sessions
            include = bool(getattr(args, "include_chat_sessions", False))
            chats = chat_sessions.purge(home, cache_id=None, include_sessions=include, dry_run=bool(args.dry_run))
            chat_part = chats.to_json()
    except WerkError as exc:
        return _fail(args, exc, err)
    doc = {**outcome.to_json(), "backend_caches": [b.to_json() for b in removed], **chat_part}
    if prompts:
        gone = [p.matched - p.skipped_pinned - p.skipped_active if p.dry_run else p.removed for p in prompts]
        doc["prompt_caches_removed"] = sum(gone)
        doc["prompt_caches_bytes"] = sum(p.bytes or 0 for p in prompts)
        doc["skipped_active"] = outcome.skipped_active + sum(p.skipped_active for p in prompts)
        doc["skipped_pinned"] = outcome.skipped_pinned + sum(p.skipped_pinned for p in prompts)
    _emit(args, doc, out, purge_text(doc))
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``cache`` command group (``list``, ``purge``) to the ``werk`` parser."""
    cache = subparsers.add_parser(
        "cache",
        help="inspect and clean local runtime-state storage",
        description="Runtime states, backend caches and chat sessions under WERK_HOME.",
        epilog="exit status: 0 done, 1 no such (inactive) entry, 2 usage error (docs/cli.md)",
    )
    sub = cache.add_subparsers(dest="cache_command", required=True)
    lst = sub.add_parser("list", help="inventory runtime states with sizes, pinned and active marks")
    lst.add_argument("--home", help="WERK_HOME (default: $WERK_HOME or ~/.werk)")
    add_json_flag(lst)
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
    add_json_flag(purge)
    purge.set_defaults(handler=cmd_purge)
