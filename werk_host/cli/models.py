"""``werk models``: the model manifests under ``WERK_HOME`` (docs/cli.md, "werk models").

* ``werk models`` (or ``werk models list``) prints a table NAME, BACKEND, FILES/SIZE, PARAMS;
  ``--json`` prints the manifests (with their ``identity``) as JSON.
* ``werk models add NAME PATH...`` and ``werk models rm NAME`` print one line saying what
  happened and what to do next; ``--json`` prints the manifest / ``{"name", "removed"}``.
* Errors are one line ``werk: <problem> (<fix>)`` (the JSON error object under ``--json``).
  Exit status: 0 done, 1 nothing to remove or a model file not found, 2 a usage error (bad
  name, bad ``--param``).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from werk_host.cli.output import add_json_flag, emit, fail, human_bytes, table, wants_json
from werk_host.errors import ErrorCode, WerkError
from werk_host.models import ModelManifest, ModelRegistry, model_dir_files, parse_param
from werk_host.paths import PrivateDirError, werk_home

COLUMNS = ("NAME", "BACKEND", "FILES/SIZE", "PARAMS")


def _record(manifest: ModelManifest) -> dict[str, Any]:
    return {**manifest.as_dict(), "identity": manifest.identity}


def _size(manifest: ModelManifest) -> str:
    count = len(manifest.files)
    total = human_bytes(sum(f.bytes for f in manifest.files))
    return total if count == 1 else f"{count} files, {total}"


def _params(manifest: ModelManifest) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(manifest.params.items())) or "-"


def render_table(manifests: list[ModelManifest]) -> str:
    """One row per manifest (or how to register one when there is none)."""
    if not manifests:
        return "no models registered (add one with: werk models add NAME FILE.gguf)"
    rows = [(m.name, m.backend or "any", _size(m), _params(m)) for m in manifests]
    return table(COLUMNS, rows)


def _failed(args: argparse.Namespace, err: Exception) -> int:
    """One error line (or JSON) for a failed command; its exit status."""
    if isinstance(err, WerkError):
        fix = None
        if err.code is ErrorCode.INVALID_REQUEST:
            fix = "pick another NAME, e.g. smollm2-135m"
        elif err.code is ErrorCode.NOT_FOUND:
            fix = "check the path"
        fail(args, err.message, fix, code=err.code.value)
        return 2 if err.code is ErrorCode.INVALID_REQUEST else 1
    if isinstance(err, ValueError):  # a --param without KEY=VALUE
        fail(args, str(err), "pass --param KEY=VALUE", code="invalid_request")
        return 2
    fail(args, str(err), None)
    return 1


def cmd_models_add(args: argparse.Namespace) -> int:
    try:
        params = dict(parse_param(p) for p in args.param or [])
        paths = [Path(p) for p in args.path]
        if len(paths) == 1 and paths[0].is_dir():  # a model directory: all of its files
            paths = model_dir_files(paths[0])
        manifest = ModelManifest.from_paths(args.name, paths, backend=args.backend, params=params)
        ModelRegistry(werk_home(args.home)).add(manifest)
    except (WerkError, ValueError, PrivateDirError) as err:
        return _failed(args, err)
    total = human_bytes(sum(f.bytes for f in manifest.files))
    text = (
        f"added model {manifest.name!r} ({manifest.backend or 'any backend'}, {total}) — "
        f"serve it with: werk serve --model {manifest.name}"
    )
    emit(args, _record(manifest), text)
    return 0


def cmd_models_list(args: argparse.Namespace) -> int:
    try:
        manifests = ModelRegistry(werk_home(args.home)).list()
    except (WerkError, PrivateDirError) as err:
        return _failed(args, err)
    emit(args, [_record(m) for m in manifests], render_table(manifests))
    return 0


def cmd_models_rm(args: argparse.Namespace) -> int:
    try:
        removed = ModelRegistry(werk_home(args.home)).remove(args.name)
    except (WerkError, PrivateDirError) as err:
        return _failed(args, err)
    if not removed and not wants_json(args):
        fail(args, f"no model named {args.name!r}", "see the registered names with: werk models")
        return 1
    emit(args, {"name": args.name, "removed": removed}, f"removed model {args.name!r} (its files stay where they are)")
    return 0 if removed else 1


def _common(parser: argparse.ArgumentParser, *, leaf: bool) -> None:
    """``--home`` and ``--json`` on ``werk models`` and on each sub-command (a sub-command's own
    copy does not reset what was given before it)."""
    default: Any = argparse.SUPPRESS if leaf else None
    parser.add_argument("--home", default=default, help="WERK_HOME (default: $WERK_HOME or ~/.werk)")
    if leaf:
        parser.add_argument(
            "--json", action="store_true", default=argparse.SUPPRESS, help="print JSON instead of text (for scripts)"
        )
    else:
        add_json_flag(parser)


def register(sub: Any) -> None:
    p = sub.add_parser(
        "models",
        help="manage model manifests (alone: list them)",
        description="The model manifests under WERK_HOME. Alone, `werk models` lists them.",
        epilog="exit status: 0 done, 1 nothing to remove or a model file not found, 2 usage error (docs/cli.md)",
    )
    _common(p, leaf=False)
    p.set_defaults(handler=cmd_models_list)
    msub = p.add_subparsers(dest="models_command", metavar="COMMAND")
    add = msub.add_parser("add", help="register a model file (or a model directory's files) under NAME")
    add.add_argument("name")
    add.add_argument("path", nargs="+", help="a GGUF file, the files of a model, or one model directory")
    add.add_argument("--backend", help="the backend that serves it (default: the first that fits)")
    add.add_argument("--param", action="append", metavar="KEY=VALUE", help="a model parameter (repeatable)")
    add.set_defaults(handler=cmd_models_add)
    msub.add_parser("list", help="list manifests (the default)").set_defaults(handler=cmd_models_list)
    rm = msub.add_parser("rm", help="remove a manifest (not the model file)")
    rm.add_argument("name")
    rm.set_defaults(handler=cmd_models_rm)
    for parser in (add, rm, msub.choices["list"]):
        _common(parser, leaf=True)
