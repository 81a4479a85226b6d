"""No import under ``werk_host/`` runs back up the layers of docs/architecture.md ("Layers").

The order is read from that table (lowest row first; each row's module column names files and
packages under ``werk_host/``). Every ``import`` statement counts, the lazy ones inside
functions and those under ``TYPE_CHECKING`` too. A module that no row names fails as well, so a
new module is placed in the table before it is imported by anyone.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "werk_host"
TABLE = ROOT / "docs" / "architecture.md"


def layer_rows(text: str) -> list[tuple[str, list[str]]]:
    """``(layer name, [path under werk_host/ ...])`` per row of the Layers table, lowest first.
    A name without a directory in a row continues the previous entry's directory
    (``werk_host/hookspecs.py``, ``seam.py``)."""
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    rows: list[tuple[str, list[str]]] = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or cells[0] in ("seed layer", "") or set(cells[0]) <= {"-"}:
            continue
        paths: list[str] = []
        base = ""
        for name in re.findall(r"`([^`]+)`", cells[1]):
            if name.startswith("werk_host/"):
                name = name.removeprefix("werk_host/")
                base = name.rsplit("/", 1)[0] + "/" if "/" in name.rstrip("/") else ""
            elif "/" not in name:
                name = base + name
            else:
                continue  # outside werk_host/ (plugins/<name>/)
            paths.append(name)
        if paths:
            rows.append((cells[0], paths))
    return rows


def module_path(module: str) -> str | None:
    """``werk_host.a.b`` → its path under ``werk_host/`` (``a/b.py`` or ``a/b/__init__.py``)."""
    parts = module.split(".")[1:]
    file = PACKAGE.joinpath(*parts).with_suffix(".py") if parts else None
    if file is not None and file.is_file():
        return "/".join(parts) + ".py"
    if PACKAGE.joinpath(*parts, "__init__.py").is_file():
        return "/".join([*parts, "__init__.py"])
    return None


def layer_of(path: str, rows: list[tuple[str, list[str]]]) -> int | None:
    """The row whose longest entry names ``path`` (a file, or a package it lies under)."""
    best: tuple[int, int] | None = None
    for index, (_, entries) in enumerate(rows):
        for entry in entries:
            hit = path == entry if entry.endswith(".py") else path.startswith(entry.rstrip("/") + "/")
            if hit and (best is None or len(entry) > best[1]):
                best = (index, len(entry))
    return best[0] if best is not None else None


def imports_of(file: Path) -> list[tuple[int, str]]:
    """``(line, werk_host module)`` for every import in ``file``, resolved to a module file:
    ``from werk_host.x import y`` is the module ``werk_host.x.y`` when that is a module."""
    module = "werk_host." + ".".join(file.relative_to(PACKAGE).with_suffix("").parts)
    module = module.removesuffix(".__init__")
    package = module if file.name == "__init__.py" else module.rsplit(".", 1)[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "werk_host"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            if target.split(".")[0] != "werk_host":
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.append((node.lineno, sub if module_path(sub) is not None else target))
    return found


def test_the_table_orders_the_layers() -> None:
    rows = layer_rows(TABLE.read_text(encoding="utf-8"))
    names = [name for name, _ in rows]
    assert names.index("Typed protocol DTOs") < names.index("Plugin seam") < names.index("Local control service")
    assert names.index("Local control service") < names.index("HTTP adapter") < names.index("CLI")


def test_no_module_imports_a_layer_above_its_own() -> None:
    rows = layer_rows(TABLE.read_text(encoding="utf-8"))
    unplaced: list[str] = []
    upward: list[str] = []
    for file in sorted(PACKAGE.rglob("*.py")):
        path = file.relative_to(PACKAGE).as_posix()
        own = layer_of(path, rows)
        if own is None:
            unplaced.append(path)
            continue
        for line, target in imports_of(file):
            target_path = module_path(target)
            if target_path is None:
                continue
            theirs = layer_of(target_path, rows)
            if theirs is not None and theirs > own:
                upward.append(f"werk_host/{path}:{line} ({rows[own][0]}) imports {target} ({rows[theirs][0]})")
    assert not unplaced, f"no row of docs/architecture.md's Layers table names: {unplaced}"
    assert not upward, "imports that run back up the layers:\n" + "\n".join(upward)
