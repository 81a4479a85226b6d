"""``werk jobs list | show ID | cancel ID | purge ID... | --all [--dry-run]`` (docs/cli.md,
"werk jobs"; docs/media.md, "Jobs").

The job records under ``WERK_HOME/jobs`` of every key (the operator's view: it reads the files,
no key is involved), whether or not a server runs (werk_host/store/jobs.py: how the command and a
serving host share the tree). ``list`` prints a table (ID, OWNER, KIND, MODEL, STATUS, PROGRESS,
RESULTS, CREATED) and is read-only; ``show`` one record; ``cancel`` a queued or running job (the
serving host's runner stops it within a quarter second; with no server, the record is marked
``cancelled`` at once); ``purge`` removes terminal records (queued and running ones are never
removed: cancel them first). ``--json`` prints the documents. Exit status 0 done, 1 no such job,
2 a usage error.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from typing import Any, TextIO

from werk_host.cli.output import add_json_flag, human_bytes, table, wants_json
from werk_host.errors import ErrorCode, WerkError
from werk_host.paths import werk_home
from werk_host.protocol.media import JobStatus
from werk_host.store.jobs import JOB_ID_RE, JobRecord, JobStore, jobs_root, now_ms

COLUMNS = ("ID", "OWNER", "KIND", "MODEL", "STATUS", "PROGRESS", "RESULTS", "CREATED")


def _store(args: argparse.Namespace) -> JobStore:
    store = JobStore(jobs_root(werk_home(getattr(args, "home", None))))
    store.open_index()
    return store


def _doc(record: JobRecord) -> dict[str, Any]:
    return {**record.view().model_dump(mode="json"), "owner_prefix": record.owner[:8]}


def _when(unix_ms: int | None) -> str | None:
    if unix_ms is None:
        return None
    return datetime.datetime.fromtimestamp(unix_ms / 1000, tz=datetime.UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _row(record: JobRecord) -> list[object]:
    progress = record.progress
    done = f"{progress.step}/{progress.steps}" if progress.steps else None
    results = f"{len(record.results)} ({human_bytes(record.result_bytes)})" if record.results else None
    return [
        record.id,
        f"{record.owner[:8]}…",
        record.kind,
        record.model,
        record.status.value,
        done,
        results,
        _when(record.created_unix_ms),
    ]


def _out(args: argparse.Namespace, value: Any, text: str, out: TextIO) -> None:
    out.write((json.dumps(value, indent=2, sort_keys=True) if wants_json(args) else text) + "\n")
    out.flush()


def _fail(args: argparse.Namespace, err: WerkError, out: TextIO) -> int:
    if wants_json(args):
        out.write(json.dumps({"error": {"code": err.code.value, "message": err.public_message()}}) + "\n")
    else:
        out.write(f"werk: {err.public_message()} (see the ids with: werk jobs list)\n")
    return 2 if err.code is ErrorCode.INVALID_REQUEST else 1


def _checked(job_id: str) -> str:
    if not JOB_ID_RE.fullmatch(job_id):
        raise WerkError(ErrorCode.INVALID_REQUEST, "a job id is job_ followed by 24 hex digits")
    return job_id


def cmd_list(args: argparse.Namespace, *, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    records = _store(args).listing(None)
    text = table(COLUMNS, [_row(r) for r in records]) if records else "no jobs"
    _out(args, [_doc(r) for r in records], text, out)
    return 0


def cmd_show(args: argparse.Namespace, *, out: TextIO | None = None, err: TextIO | None = None) -> int:
    out = out or sys.stdout
    try:
        record = _store(args).get(None, _checked(args.id))
    except WerkError as exc:
        return _fail(args, exc, err or sys.stderr)
    doc = _doc(record)
    text = "\n".join(f"{k}: {json.dumps(v) if isinstance(v, dict | list) else v}" for k, v in doc.items())
    _out(args, doc, text, out)
    return 0


def cmd_cancel(args: argparse.Namespace, *, out: TextIO | None = None, err: TextIO | None = None) -> int:
    out = out or sys.stdout
    try:
        store = _store(args)
        record = store.get(None, _checked(args.id))
        if record.status.terminal:
            text = f"{record.id} already ended: {record.status.value}"
        elif store.served():
            store.request_cancel(record.id)
            text = f"{record.id}: cancel requested (the serving host stops it)"
        else:
            record.status, record.finished_unix_ms = JobStatus.CANCELLED, now_ms()
            store.update(record)
            text = f"{record.id}: cancelled"
    except WerkError as exc:
        return _fail(args, exc, err or sys.stderr)
    _out(args, _doc(store.get(None, record.id)), text, out)
    return 0


def cmd_purge(args: argparse.Namespace, *, out: TextIO | None = None, err: TextIO | None = None) -> int:
    out = out or sys.stdout
    try:
        if bool(args.ids) == bool(args.purge_all):
            raise WerkError(ErrorCode.INVALID_REQUEST, "give job ids or --all, not both")
        store = _store(args)
        ids = tuple(_checked(i) for i in args.ids)
        for job_id in ids:
            store.get(None, job_id)
        if args.dry_run:
            chosen = [r for r in store.listing(None) if r.status.terminal and (not ids or r.id in ids)]
            doc = {"removed": len(chosen), "bytes": sum(r.result_bytes for r in chosen), "dry_run": True}
        else:
            purged = store.purge(None, ids=ids)
            doc = {"removed": purged.removed, "bytes": purged.bytes, "dry_run": False}
    except WerkError as exc:
        return _fail(args, exc, err or sys.stderr)
    verb = "would remove" if doc["dry_run"] else "removed"
    _out(args, doc, f"{verb} {doc['removed']} job(s) ({human_bytes(int(doc['bytes']))}); queued and running kept", out)
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``jobs`` command group to the ``werk`` parser."""
    jobs = subparsers.add_parser(
        "jobs",
        help="list, inspect, cancel and purge media job records",
        description="Job records under WERK_HOME/jobs (docs/media.md, 'Jobs').",
        epilog="exit status: 0 done, 1 no such job, 2 usage error (docs/cli.md)",
    )
    sub = jobs.add_subparsers(dest="jobs_command", required=True)
    for name, handler, helptext in (
        ("list", cmd_list, "every job record, of every key"),
        ("show", cmd_show, "one job record"),
        ("cancel", cmd_cancel, "cancel a queued or running job"),
    ):
        parser = sub.add_parser(name, help=helptext)
        if name != "list":
            parser.add_argument("id", metavar="ID", help="a job id from `werk jobs list`")
        parser.add_argument("--home", help="WERK_HOME (default: $WERK_HOME or ~/.werk)")
        add_json_flag(parser)
        parser.set_defaults(handler=handler)
    purge = sub.add_parser("purge", help="remove finished job records (or --all of them)")
    purge.add_argument("ids", nargs="*", metavar="ID", help="job ids from `werk jobs list`")
    purge.add_argument("--all", dest="purge_all", action="store_true", help="every finished job")
    purge.add_argument("--dry-run", action="store_true", help="preview only; changes nothing")
    purge.add_argument("--home", help="WERK_HOME (default: $WERK_HOME or ~/.werk)")
    add_json_flag(purge)
    purge.set_defaults(handler=cmd_purge)
