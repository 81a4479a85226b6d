"""Text output of ``werk runtime …`` (docs/cli.md, "werk runtime"): tables where a list is the
point (``states list``, ``experts list``, ``capabilities``, ``deployments``), a preview note on
mutations. Each function takes the command's JSON result (what ``--json`` prints) and returns
the text; everything else prints through :func:`werk_host.cli.output.render`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from werk_host.cli.deployments import render_table
from werk_host.cli.output import render, table
from werk_host.protocol import Deployments

Text = Callable[[Any], str]


def _size(value: object) -> str | None:
    """Bytes as B/KiB/MiB/GiB (``None`` when unknown)."""
    if not isinstance(value, int) or isinstance(value, bool):
        return None
    if value < 1024:
        return f"{value} B"
    scaled, unit = float(value) / 1024, "KiB"
    for bigger in ("MiB", "GiB"):
        if scaled < 1024:
            break
        scaled, unit = scaled / 1024, bigger
    return f"{scaled:.1f} {unit}"


def _yes(flag: object) -> str:
    return "yes" if flag else "no"


def _page(value: Any, key: str, columns: tuple[str, ...], row: Callable[[Any], list[object]]) -> str:
    items = value.get(key) or []
    lines = [table(columns, [row(item) for item in items]) if items else f"no {key}"]
    if value.get("next_cursor"):
        lines.append(f"more: repeat with --cursor {value['next_cursor']}")
    return "\n".join(lines)


def states_text(value: Any) -> str:
    """``states list``: one row per state, then the next page's cursor."""
    return _page(
        value,
        "states",
        ("ID", "MODEL", "BACKEND", "TIER", "STATUS", "SIZE", "PINNED", "REUSABLE"),
        lambda s: [
            s.get("id"),
            s.get("model_id"),
            s.get("backend"),
            s.get("tier"),
            s.get("status"),
            _size(s.get("bytes")),
            _yes(s.get("pinned")),
            _yes(s.get("reusable")),
        ],
    )


def experts_text(value: Any) -> str:
    """``experts list``: one row per expert, then the next page's cursor."""
    return _page(
        value,
        "experts",
        ("ID", "MODEL", "TIER", "SIZE", "HOTNESS", "PINNED"),
        lambda e: [
            e.get("id"),
            e.get("model_id"),
            e.get("tier"),
            _size(e.get("bytes")),
            e.get("hotness"),
            _yes(e.get("pinned")),
        ],
    )


def capabilities_text(value: Any) -> str:
    """``capabilities``: id, status, operations and detail, one capability a row."""
    if not value:
        return "no capabilities"
    rows = [
        [c.get("id"), c.get("status"), ",".join(c.get("operations") or []) or None, c.get("detail") or None]
        for c in value
    ]
    return table(("CAPABILITY", "STATUS", "OPERATIONS", "DETAIL"), rows)


def preview_text(value: Any) -> str:
    """A mutation's result, and whether it was only a preview."""
    text = render(value)
    if isinstance(value, dict) and value.get("dry_run") is True:
        text += "\npreview only: nothing changed; repeat with --execute to act"
    return text


def deployments_text(value: Any) -> str:
    """``deployments``: the table ``werk deployments`` prints."""
    return render_table(Deployments.model_validate(value))
