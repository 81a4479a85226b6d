"""How every ``werk`` command prints (docs/cli.md, "Output and exit codes").

* Human-readable by default: a table for a list of records, ``key: value`` lines (nested
  records indented) for one record; ``--json`` (:func:`add_json_flag`) prints the same value as
  JSON for scripts, unchanged from what the server or the command produced.
* An error is one line on stderr, ``werk: <what went wrong> (<what to do>)``, with the JSON
  error object instead under ``--json``; the exit code is the command's documented one.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any


def add_json_flag(parser: argparse.ArgumentParser) -> None:
    """``--json``: print the result (and any error) as JSON instead of text."""
    parser.add_argument("--json", action="store_true", help="print JSON instead of text (for scripts)")


def wants_json(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "json", False))


def table(columns: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Left-aligned columns separated by two spaces; ``None`` prints ``-``."""
    cells = [list(columns)] + [["-" if cell is None else str(cell) for cell in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells)


def human_bytes(count: int) -> str:
    """A byte count in decimal units, as people read sizes (``98 MB``, ``1.2 GB``, ``512 B``)."""
    size = float(count)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if size < 999.5 or unit == "TB":
            return f"{size:.0f} {unit}" if unit == "B" or size >= 9.95 else f"{size:.1f} {unit}"
        size /= 1000
    raise AssertionError("unreachable")


def _scalar(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, str):
        return value
    return json.dumps(value)


def _uniform_records(value: object) -> list[str] | None:
    """The shared keys when ``value`` is a non-empty list of flat records, else ``None``."""
    if not isinstance(value, list) or not value or not all(isinstance(v, Mapping) for v in value):
        return None
    keys = list(value[0])
    if any(list(v) != keys for v in value):
        return None
    if any(isinstance(v[k], Mapping | list) and v[k] for v in value for k in keys):
        return None
    return [str(k) for k in keys]


def render(value: Any, indent: int = 0) -> str:
    """A JSON-like value as text: records as ``key: value`` lines, lists of flat records as a
    table, other lists one item per line."""
    pad = " " * indent
    keys = _uniform_records(value)
    if keys is not None:
        rows = [[_scalar(record[k]) for k in keys] for record in value]
        text = table([k.upper().replace("_", "-") for k in keys], rows)
        return "\n".join(pad + line for line in text.splitlines())
    if isinstance(value, Mapping):
        lines = []
        for key, item in value.items():
            if isinstance(item, Mapping | list) and item:
                lines.append(f"{pad}{key}:")
                lines.append(render(item, indent + 2))
            else:
                lines.append(f"{pad}{key}: {_scalar(item) if item != [] and item != {} else '-'}")
        return "\n".join(lines) if lines else f"{pad}-"
    if isinstance(value, list):
        if not value:
            return f"{pad}(none)"
        parts = []
        for item in value:
            if isinstance(item, Mapping | list):
                parts.append(f"{pad}-")
                parts.append(render(item, indent + 2))
            else:
                parts.append(f"{pad}- {_scalar(item)}")
        return "\n".join(parts)
    return pad + _scalar(value)


def emit(args: argparse.Namespace, value: Any, text: str | None = None) -> None:
    """Print ``value``: as JSON under ``--json``, else ``text`` (or :func:`render` of it)."""
    if wants_json(args):
        print(json.dumps(value, indent=2, sort_keys=True), flush=True)
    else:
        print(text if text is not None else render(value), flush=True)


def fail(args: argparse.Namespace | None, message: str, fix: str | None = None, *, code: str = "error") -> None:
    """One error line on stderr (the JSON error object under ``--json``)."""
    if args is not None and wants_json(args):
        body = {"error": {"code": code, "message": message, "fix": fix}}
        print(json.dumps(body, indent=2, sort_keys=True), file=sys.stderr, flush=True)
        return
    line = f"werk: {message.rstrip('.')}"
    if fix:
        line += f" ({fix})"
    print(line, file=sys.stderr, flush=True)
