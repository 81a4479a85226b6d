"""``werk models``: the model manifests under ``WERK_HOME``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from werk_host.models import ModelManifest, ModelRegistry, parse_param
from werk_host.paths import werk_home


def print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=True))


# -- models ------------------------------------------------------------------------------
def cmd_models_add(args: argparse.Namespace) -> int:
    params = dict(parse_param(p) for p in args.param or [])
    paths = [Path(p) for p in args.path]
    if len(paths) == 1 and paths[0].is_dir():  # a Hugging Face model directory: all of its files
        paths = sorted(p for p in paths[0].iterdir() if p.is_file() and not p.name.startswith("."))
    manifest = ModelManifest.from_paths(args.name, paths, backend=args.backend, params=params)
    ModelRegistry(werk_home(args.home)).add(manifest)
    print_json({**manifest.as_dict(), "identity": manifest.identity})
    return 0


def cmd_models_list(args: argparse.Namespace) -> int:
    print_json([{**m.as_dict(), "identity": m.identity} for m in ModelRegistry(werk_home(args.home)).list()])
    return 0


def cmd_models_rm(args: argparse.Namespace) -> int:
    removed = ModelRegistry(werk_home(args.home)).remove(args.name)
    print_json({"name": args.name, "removed": removed})
    return 0 if removed else 1


def register(sub: Any) -> None:
    p = sub.add_parser("models", help="manage model manifests")
    msub = p.add_subparsers(dest="models_command", required=True)
    add = msub.add_parser("add", help="register a model file (or a model directory's files) under NAME")
    add.add_argument("name")
    add.add_argument("path", nargs="+", help="a GGUF file, the files of a model, or one model directory")
    add.add_argument("--backend")
    add.add_argument("--param", action="append", metavar="KEY=VALUE")
    add.set_defaults(handler=cmd_models_add)
    msub.add_parser("list", help="list manifests").set_defaults(handler=cmd_models_list)
    rm = msub.add_parser("rm", help="remove a manifest (not the model file)")
    rm.add_argument("name")
    rm.set_defaults(handler=cmd_models_rm)
    for parser in (add, rm, msub.choices["list"]):
        parser.add_argument("--home", help="WERK_HOME")
